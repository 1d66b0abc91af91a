#!/bin/bash
# MLA kernels on the GPU machine (the device tool), from the repository root (issue 22): builds the
# parity tests and mla_bench, runs the MLA parity suite (every KV row format against the CPU
# reference), the benchmark with its ceilings, and the PyTorch baseline. Logs go to $OUT.
# BENCH=0 / TORCH=0 skip those stages; PARITY_FILTER narrows the tests (default MlaAttention.*).
# Carry: .devcarry/cuda (debs/ and shared/), as the other bench/cuda scripts.
set -u
source bench/cuda/device_env.sh  # OUT, C, P, PKG; carried deps unpacked
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
t0=$(date +%s)
dev_configure
dev_build strata_parity_test strata_bench_mla_bench
echo "build: $(( $(date +%s) - t0 )) s"
timeout 120 ./build-dev/strata_parity_test --gtest_filter="${PARITY_FILTER:-MlaAttention.*}" \
  >"$OUT/mla_parity.log" 2>&1
echo "parity: exit status $?"
grep -E "nmse|differ|OK|FAILED|PASSED|Failure|error|Expected|Which is|actual" "$OUT/mla_parity.log" | tail -120
echo "parity: $(( $(date +%s) - t0 )) s"
[ "${BENCH:-1}" = 1 ] && timeout 90 ./build-dev/strata_bench_mla_bench 2>&1 | tee "$OUT/mla_bench.log"
echo "bench: $(( $(date +%s) - t0 )) s"
[ "${TORCH:-1}" = 1 ] && timeout 60 python3 bench/cuda/mla_torch_baseline.py 2>&1 | tee "$OUT/mla_torch.log"
echo "total: $(( $(date +%s) - t0 )) s"
