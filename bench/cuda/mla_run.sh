#!/bin/bash
# MLA kernels on the GPU machine (the device tool), from the repository root (issue 22): builds the
# parity tests and mla_bench, runs the MLA parity suite (every KV row format against the CPU
# reference; the decode kernel's tests first, with their own time limit: a hang there must not eat
# the run), the benchmark with its ceilings (without the decode kernel if its tests failed), and
# the PyTorch baseline. Logs go to $OUT. BENCH=0 / TORCH=0 skip those stages; PARITY_FILTER
# narrows the remaining tests (default MlaAttention.*). Carry: .devcarry/cuda (debs/ and shared/).
set -u
source bench/cuda/device_env.sh  # OUT, C, P, PKG; carried deps unpacked
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
t0=$(date +%s)
dev_configure
dev_build strata_parity_test strata_bench_mla_bench
echo "build: $(( $(date +%s) - t0 )) s"
pick() { grep -E "nmse|differ|OK|FAILED|PASSED|Failure|error|Expected|Which is|actual" "$1" | tail -${2:-120}; }
timeout 60 ./build-dev/strata_parity_test --gtest_filter="MlaAttention.DecodeEveryLayout:MlaAttention.DecodeConversions" \
  >"$OUT/mla_parity_decode.log" 2>&1
dec=$?
echo "parity (decode kernel first): exit status $dec"
pick "$OUT/mla_parity_decode.log" 60
timeout 90 ./build-dev/strata_parity_test \
  --gtest_filter="${PARITY_FILTER:-MlaAttention.*}:-MlaAttention.DecodeEveryLayout:MlaAttention.DecodeConversions" \
  >"$OUT/mla_parity.log" 2>&1
echo "parity: exit status $?"
pick "$OUT/mla_parity.log" 100
echo "parity: $(( $(date +%s) - t0 )) s"
dk=1
[ $dec = 0 ] || { dk=0; echo "bench without the decode kernel (its parity run failed)"; }
[ "${BENCH:-1}" = 1 ] && timeout 100 ./build-dev/strata_bench_mla_bench --decode-kernel $dk 2>&1 | tee "$OUT/mla_bench.log"
echo "bench: $(( $(date +%s) - t0 )) s"
[ "${TORCH:-1}" = 1 ] && timeout 60 python3 bench/cuda/mla_torch_baseline.py 2>&1 | tee "$OUT/mla_torch.log"
echo "total: $(( $(date +%s) - t0 )) s"
