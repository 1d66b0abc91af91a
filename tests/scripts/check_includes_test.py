#!/usr/bin/env python3
"""Tests of scripts/check_includes.py on small trees made here: a tree that follows the rules
passes, and each kind of wrong include fails with its file:line and the include it names."""
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "check_includes.py"


def write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


class CheckIncludesTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.root = Path(self.tmp.name)
        # A tree that keeps every rule: the engine over the op interface and the kv folder, the
        # CUDA backend over the interface and the reference, dist over the engine and the factory.
        write(self.root, "src/core/status.h", "#pragma once\n#include <string>\n")
        write(self.root, "src/kv/page_pool.h", '#pragma once\n#include "core/status.h"\n')
        write(self.root, "src/backend/backend.h", '#pragma once\n#include "core/status.h"\n')
        write(self.root, "src/backend/cpu/cpu_backend.h", '#include "backend/backend.h"\n')
        write(self.root, "src/backend/cuda/ops.cu",
              '#include <cuda_runtime.h>\n#include "backend/cpu/cpu_backend.h"\n')
        write(self.root, "src/backend/factory/rank_factory.cc",
              '#include "backend/cpu/cpu_backend.h"\n')
        write(self.root, "src/engine/engine.h",
              '#pragma once\n#include "backend/backend.h"\n#include "kv/page_pool.h"\n')
        write(self.root, "src/engine/engine.cc", '#include "engine/engine.h"\n#include <vector>\n')
        write(self.root, "src/dist/tp.cc",
              '#include "engine/engine.h"\n#include "backend/factory/rank_factory.cc"\n')
        write(self.root, "tools/flags.h", "#pragma once\n#include <CLI/CLI.hpp>\n")
        write(self.root, "tools/main.cc", '#include "flags.h"\n#include "dist/tp.cc"\n')

    def tearDown(self):
        self.tmp.cleanup()

    def run_check(self):
        r = subprocess.run([sys.executable, str(SCRIPT), str(self.root)], capture_output=True, text=True)
        return r.returncode, r.stdout

    def test_a_tree_that_keeps_the_rules_passes(self):
        self.assertEqual(self.run_check(), (0, ""))

    def test_the_engine_including_the_cpu_backend_fails_with_the_line(self):
        write(self.root, "src/engine/engine.cc",
              '#include "engine/engine.h"\n#include "backend/cpu/cpu_backend.h"\n')
        rc, out = self.run_check()
        self.assertEqual(rc, 1)
        self.assertIn('src/engine/engine.cc:2: engine/ includes "backend/cpu/cpu_backend.h"', out)
        self.assertEqual(len(out.splitlines()), 1, out)

    def test_an_arrow_pointing_up_fails(self):
        write(self.root, "src/kv/page_pool.h", '#pragma once\n#include "engine/engine.h"\n')
        rc, out = self.run_check()
        self.assertEqual(rc, 1)
        self.assertIn('src/kv/page_pool.h:2: kv/ includes "engine/engine.h" (engine/)', out)

    def test_a_cuda_header_outside_backend_cuda_fails(self):
        write(self.root, "src/engine/engine.cc", '#include "engine/engine.h"\n  #  include <cuda_runtime.h>\n')
        rc, out = self.run_check()
        self.assertEqual(rc, 1)
        self.assertIn("src/engine/engine.cc:2: engine/ includes <cuda_runtime.h>", out)

    def test_tools_may_not_name_a_concrete_backend(self):
        write(self.root, "tools/main.cc", '#include "backend/cuda/ops.cu"\n')
        rc, out = self.run_check()
        self.assertEqual(rc, 1)
        self.assertIn('tools/main.cc:1: tools/ includes "backend/cuda/ops.cu"', out)

    def test_a_missing_header_and_an_unknown_folder_fail(self):
        write(self.root, "src/engine/engine.cc", '#include "engine/gone.h"\n')
        write(self.root, "src/widgets/w.h", '#include "core/status.h"\n')
        rc, out = self.run_check()
        self.assertEqual(rc, 1)
        self.assertIn('src/engine/engine.cc:1: engine/ includes "engine/gone.h", which is no header', out)
        self.assertIn("src/widgets/w.h: src/widgets/ has no row", out)


if __name__ == "__main__":
    unittest.main()
