#!/usr/bin/env python3
"""Tests of scripts/check_format.py in small git repositories made here: lines nobody changed
are not checked, a changed line clang-format would write otherwise fails with its file:line,
a moved file is checked only where its text changed, and --fix formats the changed lines only;
--all (what CI runs) checks every line of every tracked or untracked source file."""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "check_format.py"

# Formatted as the repository's .clang-format writes it, and a line it would rewrite.
GOOD = "int add(int a, int b) { return a + b; }\n"
BAD = "int   sub( int a,int b ){return a-b;}\n"


class CheckFormatTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.root = Path(self.tmp.name)
        self.git("init", "-q", "-b", "main")
        self.git("config", "user.email", "t@example.com")
        self.git("config", "user.name", "t")
        shutil.copy(REPO / ".clang-format", self.root / ".clang-format")
        # main: an old file that was never formatted (the tree as it is).
        self.write("src/core/old.cc", BAD + GOOD)
        self.commit("main")
        self.git("checkout", "-q", "-b", "wip/x")

    def tearDown(self):
        self.tmp.cleanup()

    def git(self, *args):
        subprocess.run(["git", "-C", str(self.root), *args], check=True, capture_output=True)

    def write(self, rel, text):
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    def commit(self, message):
        self.git("add", "-A")
        self.git("commit", "-q", "-m", message)

    def run_check(self, *flags, env=None):
        e = {k: v for k, v in os.environ.items() if k != "STRATA_FORMAT_BASE"}
        e.update(env or {})
        r = subprocess.run([sys.executable, str(SCRIPT), *flags, str(self.root)], capture_output=True, text=True,
                           env=e)
        return r.returncode, r.stdout

    def test_untouched_lines_are_not_checked(self):
        self.write("src/core/old.cc", BAD + GOOD + GOOD.replace("add", "add2"))
        self.commit("a formatted line added")
        self.assertEqual(self.run_check(), (0, ""))

    def test_a_changed_line_that_is_not_formatted_fails_with_its_line(self):
        self.write("src/core/old.cc", BAD + GOOD + BAD.replace("sub", "sub2"))
        self.commit("an unformatted line added")
        rc, out = self.run_check()
        self.assertEqual(rc, 1)
        self.assertIn("src/core/old.cc:3: not as clang-format writes it", out)
        self.assertNotIn("src/core/old.cc:1:", out)

    def test_uncommitted_changes_count(self):
        self.write("tools/new.h", BAD)  # untracked
        self.write("src/core/old.cc", BAD + GOOD + BAD.replace("sub", "sub2"))  # tracked, not committed
        rc, out = self.run_check()
        self.assertEqual(rc, 1)
        self.assertIn("tools/new.h:1:", out)
        self.assertIn("src/core/old.cc:3:", out)
        self.assertNotIn("src/core/old.cc:1:", out)

    def test_a_moved_file_is_checked_where_it_changed_only(self):
        (self.root / "src/kv").mkdir()
        self.git("mv", "src/core/old.cc", "src/kv/old.cc")
        self.commit("moved")
        self.assertEqual(self.run_check(), (0, ""))

    def test_on_main_the_last_commit_is_checked(self):
        self.git("checkout", "-q", "main")
        self.assertEqual(self.run_check()[0], 1)  # the first commit: all its lines
        self.write("src/core/old.cc", BAD + GOOD + BAD.replace("sub", "sub3"))
        self.commit("main's own commit")
        rc, out = self.run_check()
        self.assertEqual(rc, 1)
        self.assertIn("src/core/old.cc:3:", out)
        self.assertNotIn("src/core/old.cc:1:", out)

    def test_files_outside_the_code_folders_and_other_languages_are_not_checked(self):
        self.write("docs/x.cc", BAD)
        self.write("src/core/x.py", BAD)
        self.write("tests/e2e/js/node_modules/m/x.h", BAD)
        self.commit("not C++ of ours")
        self.assertEqual(self.run_check(), (0, ""))

    def test_the_base_can_be_given(self):
        self.write("src/core/new.cc", BAD)
        self.commit("bad")
        self.write("src/core/other.cc", GOOD)
        self.commit("good")
        self.assertEqual(self.run_check(env={"STRATA_FORMAT_BASE": "HEAD~1"}), (0, ""))
        self.assertEqual(self.run_check(env={"STRATA_FORMAT_BASE": "HEAD~2"})[0], 1)

    def test_fix_formats_the_changed_lines_only(self):
        self.write("src/core/old.cc", BAD + GOOD + BAD.replace("sub", "sub2"))
        rc, _ = self.run_check("--fix")
        self.assertEqual(rc, 0)
        text = (self.root / "src/core/old.cc").read_text().splitlines()
        self.assertEqual(text[0], BAD.rstrip("\n"))  # untouched: left as it was
        self.assertEqual(text[2], "int sub2(int a, int b) { return a - b; }")
        self.assertEqual(self.run_check(), (0, ""))

    def test_all_checks_every_line_and_fix_formats_the_tree(self):
        self.write("src/kv/clean.cc", GOOD)
        self.commit("a formatted file beside the old one")
        rc, out = self.run_check("--all")
        self.assertEqual(rc, 1)
        self.assertIn("src/core/old.cc:1: not as clang-format writes it", out)  # nobody changed it
        self.assertNotIn("src/kv/clean.cc", out)
        self.assertEqual(self.run_check("--all", "--fix")[0], 0)
        self.assertEqual(self.run_check("--all"), (0, ""))
        self.assertEqual((self.root / "src/core/old.cc").read_text().splitlines()[0],
                         "int sub(int a, int b) { return a - b; }")


if __name__ == "__main__":
    unittest.main()
