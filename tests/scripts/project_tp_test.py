#!/usr/bin/env python3
"""Tests of bench/cuda/project_tp.py on rank_step_bench- and collectives_bench-shaped lines made
here: without --measured the sourced estimate (SGLang's custom all-reduce table), with it the
measured latencies at the log's tp, piecewise-linear between sizes and along the last two beyond
them, and a measurement of fewer than two sizes is refused."""
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "cuda" / "project_tp.py"

STEP = ("decode   batch 1, context 4096, KV bf16: step 4.000 ms as a CUDA graph (250 tok/s); "
        "skipped collectives: all_reduce 100 x {ar} B, all_gather 1 x {ag} B\n")

MEASURED = """collectives: 8 rank(s), one a GPU, NCCL_NVLS_ENABLE=0, 200 reps
collective all_reduce tp 8 bytes 1000: latency 5.00 us, back to back 4.00 us, bus 0.3 GB/s
collective all_reduce tp 8 bytes 3000: latency 7.00 us, back to back 5.00 us, bus 0.8 GB/s
collective all_reduce tp 4 bytes 1000: latency 1.00 us, back to back 1.00 us, bus 1.5 GB/s
collective all_reduce tp 4 bytes 3000: latency 1.00 us, back to back 1.00 us, bus 4.5 GB/s
collective all_gather tp 8 bytes 1000: latency 10.00 us, back to back 9.00 us, bus 0.7 GB/s
collective all_gather tp 8 bytes 2000: latency 20.00 us, back to back 19.00 us, bus 0.7 GB/s
"""


class ProjectTpTest(unittest.TestCase):
    def run_script(self, step, measured=None, check=True):
        with tempfile.TemporaryDirectory() as d:
            log = Path(d) / "step.log"
            log.write_text(step)
            args = [sys.executable, str(SCRIPT), str(log), "--tp", "8"]
            if measured is not None:
                path = Path(d) / "collectives.log"
                path.write_text(measured)
                args += ["--measured", str(path)]
            return subprocess.run(args, capture_output=True, text=True, check=check)

    def test_estimate_reads_the_sourced_table(self):
        # 4,096 bytes: 5.7 us in the table; 100 of them 0.570 ms; the all-gather 10 us + 7/8 of
        # 4,600 bytes at 460 GB/s.
        out = self.run_script(STEP.format(ar=4096, ag=4600)).stdout
        self.assertIn("(estimated collectives)", out)
        self.assertIn("100 all-reduces of 4096 B (0.570 ms)", out)
        self.assertIn("= 4.580 ms", out)

    def test_measured_interpolates_at_the_logs_tp(self):
        # 2,000 bytes: halfway between 5 and 7 us at tp 8 (tp 4's rows ignored): 6 us x 100.
        out = self.run_script(STEP.format(ar=2000, ag=1500), MEASURED).stdout
        self.assertIn("(measured collectives)", out)
        self.assertIn("100 all-reduces of 2000 B (0.600 ms)", out)
        self.assertIn("1 all-gather of 1500 B (0.015 ms)", out)
        self.assertIn("= 4.615 ms", out)

    def test_measured_extends_beyond_and_holds_below(self):
        # 5,000 bytes: along 5 -> 7 us a further 2,000 bytes: 9 us; 500 bytes: the smallest's 5 us.
        self.assertIn("(0.900 ms)", self.run_script(STEP.format(ar=5000, ag=1000), MEASURED).stdout)
        self.assertIn("(0.500 ms)", self.run_script(STEP.format(ar=500, ag=1000), MEASURED).stdout)

    def test_too_few_sizes_are_refused(self):
        one_size = "".join(l + "\n" for l in MEASURED.splitlines() if "bytes 3000" not in l)
        r = self.run_script(STEP.format(ar=2000, ag=1500), one_size, check=False)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("fewer than two all_reduce sizes", r.stdout + r.stderr)


if __name__ == "__main__":
    unittest.main()
