#!/usr/bin/env python3
"""The clang-format check. With --all (what .ci/run uses; the tree was formatted as a whole once,
in its own commit): every tracked C++/CUDA file must be as clang-format (the repository's
.clang-format) writes it. Without it: only the lines that differ from a base commit are checked
(useful on a branch made before that commit).

The base, in order: $STRATA_FORMAT_BASE; else, on a branch other than main, where it left main
(the merge base with origin/main or main: everything the branch adds); else (main itself, or a
detached checkout) the first parent of HEAD: what its last commit or merge brought. Uncommitted
changes and new untracked files count too. Moved files (git's rename
detection) are checked only where their text changed.

Usage: scripts/check_format.py [--all] [--fix] [ROOT]   (ROOT: the checkout; default: this script's ../)
  --all   every tracked and untracked (not ignored) source file, every line.
  --fix   formats the checked lines in place instead of reporting them.
Exits 1 and prints `file:line: ...` for each changed line clang-format would change; 2 when git
or clang-format ($CLANG_FORMAT, default clang-format) cannot run. Run by .ci/run; its own tests
are tests/scripts/check_format_test.py (a ctest).
"""
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

SOURCES = (".h", ".cc", ".cu", ".cuh")
FOLDERS = ("src/", "tools/", "tests/", "bench/", "fuzz/")
SKIP = ("/node_modules/",)
EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"  # git's empty tree: a first commit adds every line
HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+(\d+)(?:,(\d+))? @@")


def git(root: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=check)


def base_commit(root: Path) -> str:
    """The commit the changed lines are counted from."""
    if os.environ.get("STRATA_FORMAT_BASE"):
        return os.environ["STRATA_FORMAT_BASE"]
    branch = git(root, "symbolic-ref", "--quiet", "--short", "HEAD", check=False).stdout.strip()
    if branch and branch not in ("main", "master"):
        for ref in ("origin/main", "main"):
            if git(root, "rev-parse", "--verify", "--quiet", ref, check=False).returncode == 0:
                return git(root, "merge-base", "HEAD", ref).stdout.strip()
    # main itself or a detached checkout: what HEAD's last commit or merge brought.
    parent = git(root, "rev-parse", "--verify", "--quiet", "HEAD^1", check=False)
    if parent.returncode == 0:
        return parent.stdout.strip()
    if git(root, "rev-parse", "--is-shallow-repository").stdout.strip() == "true":
        raise RuntimeError("a shallow clone without HEAD's parent: what changed is unknown (fetch with depth >= 2 "
                           "or set STRATA_FORMAT_BASE)")
    return EMPTY_TREE


def checked(path: str) -> bool:
    return path.endswith(SOURCES) and path.startswith(FOLDERS) and not any(s in "/" + path for s in SKIP)


def changed_lines(root: Path, base: str) -> dict:
    """path -> [(first, last)] of lines added or changed since `base`, the working tree included
    (new files that git does not track yet: every line)."""
    out = git(root, "diff", "-U0", "-M", "--no-color", "--no-ext-diff", "--diff-filter=AMR", base).stdout
    ranges, path = {}, None
    for line in out.splitlines():
        if line.startswith("+++ "):
            name = line[4:]
            path = name[2:] if name.startswith("b/") and checked(name[2:]) else None
            continue
        m = HUNK.match(line)
        if m and path:
            first, count = int(m.group(1)), int(m.group(2) or "1")
            if count > 0:
                ranges.setdefault(path, []).append((first, first + count - 1))
    untracked = git(root, "ls-files", "--others", "--exclude-standard", "-z").stdout.split("\0")
    for path in filter(checked, untracked):
        n = len((root / path).read_text(encoding="utf-8", errors="replace").splitlines())
        if n > 0:
            ranges[path] = [(1, n)]
    return ranges


def all_lines(root: Path) -> dict:
    """path -> [(1, n)] for every checked file git tracks or would track (untracked, not ignored)."""
    files = git(root, "ls-files", "--cached", "--others", "--exclude-standard", "-z").stdout.split("\0")
    ranges = {}
    for path in filter(checked, files):
        full = root / path
        if not full.is_file():
            continue  # deleted in the working tree
        n = len(full.read_text(encoding="utf-8", errors="replace").splitlines())
        if n > 0:
            ranges[path] = [(1, n)]
    return ranges


def clang_format() -> str:
    exe = os.environ.get("CLANG_FORMAT", "clang-format")
    return shutil.which(exe) or ""


def main(argv: list) -> int:
    args = [a for a in argv[1:] if a not in ("--fix", "--all")]
    fix, whole_tree = "--fix" in argv[1:], "--all" in argv[1:]
    root = Path(args[0]) if args else Path(__file__).resolve().parent.parent
    exe = clang_format()
    if not exe:
        print("check_format: clang-format not found (Debian package clang-format; or set $CLANG_FORMAT)",
              file=sys.stderr)
        return 2
    try:
        base = "" if whole_tree else base_commit(root)
        ranges = all_lines(root) if whole_tree else changed_lines(root, base)
    except (subprocess.CalledProcessError, FileNotFoundError, RuntimeError) as e:
        detail = e.stderr.strip() if isinstance(e, subprocess.CalledProcessError) else e
        print(f"check_format: {root}: {detail}", file=sys.stderr)
        return 2
    findings = []
    mode = ["-i"] if fix else ["--dry-run", "--Werror", "--ferror-limit=0"]

    def run(item):
        path, spans = item
        lines = [f"--lines={a}:{b}" for a, b in spans]
        return subprocess.run([exe, "--style=file", *mode, *lines, path], cwd=root, capture_output=True, text=True)

    # One clang-format a file, as many at once as there are cores (--all: ~800 files; CI has 2).
    items = sorted(ranges.items())
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        results = list(pool.map(run, items))
    for (path, _), r in zip(items, results):
        if fix:
            if r.returncode != 0:
                print(r.stderr, file=sys.stderr)
                return 2
            continue
        # clang-format's diagnostics: "path:line:col: error: code should be clang-formatted ...".
        for d in r.stderr.splitlines():
            m = re.match(r"^(.*?):(\d+):\d+: error: code should be clang-formatted", d)
            if m:
                findings.append((path, int(m.group(2))))
        if r.returncode != 0 and not any(p == path for p, _ in findings):
            print(r.stderr, file=sys.stderr)
            return 2
    for path, line in sorted(set(findings)):
        print(f"{path}:{line}: not as clang-format writes it")
    if findings:
        scope = "line(s) of the tree" if whole_tree else f"changed line(s) since {base[:12]}"
        flags = "--all --fix" if whole_tree else "--fix"
        print(f"check_format: {len(set(findings))} {scope} differ from clang-format "
              f"(.clang-format); scripts/check_format.py {flags} formats them", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
