#!/usr/bin/env python3
"""Tests of scripts/check_cuda_layout.py on small trees made here: a backend that keeps issue 21's
structure rules passes, and each broken rule fails with its file (and line) and what it breaks."""
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "check_cuda_layout.py"

TUNABLES_H = """// Environment variables of backend/cuda/, all read here:
//   STRATA_CUDA_PDL=0            CudaTunables::pdl off.
#pragma once
struct CudaTunables {
  bool pdl = true;
  static CudaTunables from_environment();
};
"""
TUNABLES_CC = """#include "backend/cuda/tunables.h"
CudaTunables CudaTunables::from_environment() {
  CudaTunables t;
  if (const char* v = std::getenv("STRATA_CUDA_PDL")) t.pdl = !(v[0] == '0');
  return t;
}
"""
# Constants, functions, a kernel's dynamic shared memory, once-guards, a class with a static
# constant and a static function: all allowed.
NORM_CU = """// A family file: "static int not_code = 1;" in a comment, and one in a string below.
#include "backend/cuda/launch.h"

namespace strata::cuda {
namespace {

constexpr int kWarps = 8;
const char* const kName = "static int in_a_string = 0;";
extern __shared__ char smem[];
struct Shape {
  static constexpr int kRows = 4;
  static Shape make(int rows);
  int rows = 0;
};
__global__ void norm_kernel(const float* x,
                            float* y) {
  __shared__ float red[32];
  y[0] = x[0] + red[0];
}

}  // namespace

void launch_norm(const float* x, float* y, cudaStream_t stream) {
  static PerDeviceOnce limits;
  limits.run(init_norm_kernels);
  static std::once_flag once;
  static const int kBlock = 256;
  norm_kernel<<<1, kBlock, 0, stream>>>(x, y);
}

}  // namespace strata::cuda
"""


def write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


class CheckCudaLayoutTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.root = Path(self.tmp.name)
        write(self.root, "src/backend/cuda/tunables.h", TUNABLES_H)
        write(self.root, "src/backend/cuda/tunables.cc", TUNABLES_CC)
        write(self.root, "src/backend/cuda/norm.cu", NORM_CU)
        write(self.root, "src/backend/cuda/cpu_twin.cc", '#include "backend/cpu/cpu_backend.h"\n')

    def tearDown(self):
        self.tmp.cleanup()

    def run_check(self):
        r = subprocess.run([sys.executable, str(SCRIPT), str(self.root)], capture_output=True,
                           text=True)
        return r.returncode, r.stdout

    def assert_fails(self, *needles):
        code, out = self.run_check()
        self.assertEqual(code, 1, out)
        for needle in needles:
            self.assertIn(needle, out)
        return out

    def test_a_backend_that_keeps_the_rules_passes(self):
        self.assertEqual(self.run_check(), (0, ""))

    def test_a_file_over_600_lines_fails(self):
        write(self.root, "src/backend/cuda/big.cu", "int f();\n" * 600)
        self.assertEqual(self.run_check(), (0, ""))
        write(self.root, "src/backend/cuda/big.cu", "int f();\n" * 601)
        self.assert_fails("src/backend/cuda/big.cu: 601 lines, over the 600")

    def test_dispatch_over_200_lines_fails(self):
        write(self.root, "src/backend/cuda/dispatch.cc", "int f();\n" * 201)
        self.assert_fails("src/backend/cuda/dispatch.cc: 201 lines, over the 200")

    def test_a_mutable_namespace_scope_variable_fails(self):
        write(self.root, "src/backend/cuda/gemv.cu",
              "namespace strata::cuda {\n\nint g_max_rows = 2;\n\n}  // namespace strata::cuda\n")
        self.assert_fails("src/backend/cuda/gemv.cu:3: mutable namespace-scope variable: int "
                          "g_max_rows")

    def test_a_device_global_fails(self):
        write(self.root, "src/backend/cuda/gemv.cu",
              "namespace strata::cuda {\n__device__ unsigned int g_counter;\n"
              "__constant__ float c_scale[4];\n}\n")
        out = self.assert_fails("gemv.cu:2: mutable namespace-scope variable: __device__ unsigned",
                                "gemv.cu:3: mutable namespace-scope variable: __constant__ float")
        self.assertEqual(out.count("gemv.cu"), 2, out)

    def test_a_variable_over_two_lines_fails(self):
        write(self.root, "src/backend/cuda/gemv.cu",
              "namespace strata::cuda {\nstd::vector<int>\n    g_tile_sizes = {1, 2};\n}\n")
        self.assert_fails("gemv.cu:2: mutable namespace-scope variable")

    def test_a_mutable_static_local_or_member_fails(self):
        write(self.root, "src/backend/cuda/gemv.cu",
              "void f() {\n  static int calls = 0;\n  ++calls;\n}\n"
              "struct A {\n  static bool verbose;\n  static std::atomic<int> n{0};\n};\n"
              "void g() {\n  thread_local int depth = 0;\n}\n")
        out = self.assert_fails("gemv.cu:2: mutable static or thread_local: static int calls",
                                "gemv.cu:6: mutable static or thread_local: static bool verbose",
                                "gemv.cu:7: mutable static or thread_local: static std::atomic",
                                "gemv.cu:10: mutable static or thread_local: thread_local int")
        self.assertEqual(out.count("gemv.cu"), 4, out)

    def test_getenv_outside_tunables_fails(self):
        write(self.root, "src/backend/cuda/gemv.cu",
              'int rows() {\n  const char* v = std::getenv("STRATA_GEMV_ROWS");\n  return 0;\n}\n')
        self.assert_fails("src/backend/cuda/gemv.cu:2: reads or sets the environment outside "
                          "tunables.cc")

    def test_an_undocumented_environment_variable_fails(self):
        write(self.root, "src/backend/cuda/tunables.cc", TUNABLES_CC.replace(
            "  return t;",
            '  if (const char* v = std::getenv("STRATA_NEW_KNOB")) t.pdl = false;\n  return t;'))
        out = self.assert_fails("src/backend/cuda/tunables.cc:5: STRATA_NEW_KNOB is not in")
        self.assertNotIn("STRATA_CUDA_PDL", out)

    def test_the_cpu_backend_outside_the_twin_table_fails(self):
        write(self.root, "src/backend/cuda/moe.cu", '#include "backend/cpu/moe.h"\n')
        self.assert_fails("src/backend/cuda/moe.cu:1: includes backend/cpu/")


if __name__ == "__main__":
    unittest.main()
