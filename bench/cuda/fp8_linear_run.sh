#!/bin/bash
# FP8-block linears (src/backend/cuda/linear_fp8.h, issue 21 item 3) on the GPU machine, from the
# repository root, `.devcarry/cuda` carried (for the debs; no model is read): builds the parity
# tests and the FP8 linear benchmark, then
#   1. parity, in three processes so that an abort in one (a CHECK on a cuBLASLt status) does not
#      hide the others: the exact kernels (act_quant, dequant, scale repack), the W8A16 GEMV
#      (plain, SwiGLU, batched experts), the prefill path (act_quant + cuBLASLt block-scaled GEMM
#      + GEMV tail; k % 128 == 0 shapes, then odd k). Logs: $OUT/parity_*.log;
#   2. strata_bench_fp8_linear_bench (ceilings, GEMV at m = 1..16, GEMM at M = 512..8192 against
#      bf16 cuBLAS), log $OUT/bench.log, its summary table printed last.
# Stages can be skipped: STAGES="parity bench" (default both). ~2-3 minutes with the build.
set -u
source bench/cuda/device_env.sh  # OUT, C, PKG, dev_configure, dev_build; carried deps unpacked
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
t0=$(date +%s)
dev_configure
dev_build strata_parity_test strata_bench_fp8_linear_bench
echo "build: $(( $(date +%s) - t0 )) s"
for stage in ${STAGES:-parity bench}; do
  case $stage in
    parity)
      for part in exact:'Fp8Linear.ActQuantExact:Fp8Linear.DequantAndRepackExact' \
                  gemv:'Fp8Linear.Gemv*' gemm:'Fp8Linear.Gemm*'; do
        name=${part%%:*}
        t1=$(date +%s)
        timeout ${PARITY_TIMEOUT:-120} ./build-dev/strata_parity_test --gtest_filter="${part#*:}" >"$OUT/parity_$name.log" 2>&1
        echo "parity $name: rc $? ($(( $(date +%s) - t1 )) s)"
        grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|^\[       OK|Failure|CHECK failed|fp8 |Expected|Which is" \
          "$OUT/parity_$name.log" | head -80
      done ;;
    bench)
      t1=$(date +%s)
      timeout 180 ./build-dev/strata_bench_fp8_linear_bench >"$OUT/bench.log" 2>&1
      echo "bench: rc $? ($(( $(date +%s) - t1 )) s)"
      grep -E "^(device|ceiling|gemv|gemm)" "$OUT/bench.log" | head -120
      sed -n '/== summary/,$p' "$OUT/bench.log" ;;
  esac
done
echo "total: $(( $(date +%s) - t0 )) s"
