#!/bin/bash
# MLA kernels on the GPU machine (the device tool), from the repository root (issue 22): builds the
# parity tests and mla_bench, runs the MLA parity suite (every KV row format against the CPU
# reference, every kernel), the benchmark with its ceilings, and the PyTorch baseline. A kernel
# whose parity cases fail (the failure names it) is left out of the benchmark (--decode-kernel 0,
# --wgmma-pipe 0); if the suite times out (a hang), both new kernels are. Logs go to $OUT.
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
rc=$?
echo "parity: exit status $rc"
grep -E "nmse|differ|OK|FAILED|PASSED|Failure|error|Expected|Which is|actual|kernel" "$OUT/mla_parity.log" | tail -150
echo "parity: $(( $(date +%s) - t0 )) s"
dk=1 wp=1
if [ $rc = 124 ]; then
  dk=0 wp=0
elif [ $rc != 0 ]; then
  grep -q "kernel decode" "$OUT/mla_parity.log" && dk=0
  grep -q "kernel wgmma-pipe" "$OUT/mla_parity.log" && wp=0
  [ $dk = 1 ] && [ $wp = 1 ] && { dk=0; wp=0; }  # a crash names no kernel: leave both out
fi
echo "bench with --decode-kernel $dk --wgmma-pipe $wp"
[ "${BENCH:-1}" = 1 ] && timeout 120 ./build-dev/strata_bench_mla_bench --decode-kernel $dk \
  --wgmma-pipe $wp 2>&1 | tee "$OUT/mla_bench.log"
echo "bench: $(( $(date +%s) - t0 )) s"
[ "${TORCH:-1}" = 1 ] && timeout 60 python3 bench/cuda/mla_torch_baseline.py 2>&1 | tee "$OUT/mla_torch.log"
echo "total: $(( $(date +%s) - t0 )) s"
