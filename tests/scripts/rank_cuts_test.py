#!/usr/bin/env python3
"""Tests of bench/cuda/rank_cuts.py's projection on rank_step_bench-shaped logs made here: two cuts
give the line through them, three the least-squares line and its largest residual, a form timed
more than once its mean and each round's line, and a log count that does not match --layers is
refused."""
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "cuda" / "rank_cuts.py"


def log(step_b1, variant_b1, step_b8):
    return (
        f"decode   batch 1, context 4096, KV bf16: step {step_b1:.3f} ms as a CUDA graph (1 tok/s)\n"
        f"variant  batch 1, context 4096: no_split_tma step {variant_b1:.3f} ms as a CUDA graph\n"
        f"decode   batch 8, context 4096, KV bf16: step {step_b8:.3f} ms as a CUDA graph (1 tok/s)\n")


class ProjectTest(unittest.TestCase):
    def run_project(self, logs, layers, check=True):
        with tempfile.TemporaryDirectory() as d:
            paths = []
            for i, text in enumerate(logs):
                path = Path(d) / f"cut{i}.log"
                path.write_text(text)
                paths.append(str(path))
            return subprocess.run(
                [sys.executable, str(SCRIPT), "project", *paths, "--layers", layers, "--to", "61"],
                capture_output=True, text=True, check=check)

    def test_two_cuts_draw_the_line_through_them(self):
        # 0.1 ms fixed + 0.05 ms a layer: 61 layers 3.150 ms.
        out = self.run_project([log(0.3, 0.32, 1.0), log(0.5, 0.52, 2.0)], "4,8").stdout
        self.assertIn("batch 1, default", out)
        self.assertIn("3.150 ms (4 layers 0.300, 8 layers 0.500; 50.0 us/layer)", out)
        self.assertIn("batch 1, no_split_tma", out)
        self.assertIn("3.170 ms", out)
        self.assertIn("batch 8, default", out)
        self.assertNotIn("residual", out)

    def test_three_cuts_fit_a_line_and_report_the_worst_residual(self):
        # On the line 0.1 + 0.05 n except the 8-layer cut, 0.03 ms high: the fit's slope stays
        # 0.05 (the outlier sits mid-range), its intercept rises by 0.01, the residuals are
        # -0.01, +0.02, -0.01 ms.
        out = self.run_project([log(0.3, 0.3, 1.0), log(0.53, 0.5, 2.0), log(0.7, 0.7, 3.0)],
                               "4,8,12").stdout
        line = [l for l in out.splitlines() if "batch 1, default" in l][0]
        self.assertIn("3.160 ms", line)
        self.assertIn("50.0 us/layer", line)
        self.assertIn("largest residual 20.0 us", line)

    def test_a_variant_timed_twice_projects_its_mean_and_each_round(self):
        # The control `defaults` twice in each cut: 0.30 / 0.34 and 0.50 / 0.54 ms. Means 0.32 and
        # 0.52: 0.12 + 0.05 n, 61 layers 3.170; round 1 0.10 + 0.05 n = 3.150, round 2 3.190.
        def twice(a, b):
            return "".join(f"variant  batch 1, context 4096: defaults     step {ms:.3f} ms as a "
                           f"CUDA graph (default 0.300: +0.0%)\n" for ms in (a, b))
        out = self.run_project([log(0.3, 0.3, 1.0) + twice(0.30, 0.34),
                                log(0.5, 0.5, 2.0) + twice(0.50, 0.54)], "4,8").stdout
        line = [l for l in out.splitlines() if "batch 1, defaults" in l][0]
        self.assertIn("3.170 ms (4 layers 0.320, 8 layers 0.520; 50.0 us/layer", line)
        self.assertIn("mean of 2/2 timings a cut, rounds 3.150 / 3.190", line)
        # A form timed once keeps its line as before.
        line = [l for l in out.splitlines() if "batch 1, default " in l][0]
        self.assertNotIn("mean of", line)

    def test_a_log_count_off_the_layers_is_refused(self):
        r = self.run_project([log(0.3, 0.3, 1.0), log(0.5, 0.5, 2.0)], "4,8,12", check=False)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("one layer count a log", r.stderr)


if __name__ == "__main__":
    unittest.main()
