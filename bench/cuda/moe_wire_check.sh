#!/bin/bash
# Issue 23's wiring (MoE through the CUDA backend's ops: backend/cuda/moe.cu, moe_weights.h) on
# the GPU machine, from the repository root, `.devcarry/cuda` carried (the debs, and shared/ with
# fixtures/tiny — the three DeepSeek fixtures — and configs/). Under 5 minutes with the build:
#   1. build strata_parity_test and strata_bench_moe_bench (Release, build-dev);
#   2. parity, one process per suite (a CHECK abort in one does not hide the others), logs
#      $OUT/parity_<suite>.log:
#        MoeBackend.*   router linear (GEMV and cuBLAS, bias), route (softmax / sigmoid + bias +
#                       groups, exact ties and near-ties counted), experts through upload_linear
#                       (bf16, INT4 g32 / g128, FP8 block; T 1..512, with the fused shared add),
#                       refused shapes on the CPU twin (counted), a MoE step in graph mode (the
#                       eager bits), the real models' stacks tiled at the planner's bytes;
#        MoeModel.*     every layer's routing in the four DeepSeek fixtures against the CPU's
#                       choice on the GPU's own logits, the 400-token prefill vs Hugging Face;
#        QuantModel.*   fixture logits vs Hugging Face (NMSE printed per sequence), no MoE op on
#                       the CPU twin; QuantWeightBytes.*: device bytes == the planner's;
#        MoeParity.ExpertsMatchCpu  the kernels' own test (its fixture moved to moe_stack.h);
#   3. bench: strata_bench_moe_bench --what backend: copy bandwidth and bf16 GEMM ceilings, then
#      one MoE layer through the backend ops for DeepSeek-V3 (tp-8 rank, FP8), Moonlight (bf16)
#      and Kimi-K2.5 (tp-8 rank, INT4 g32) at T = 1, 8, 64 (decode) and 4096 (prefill); log
#      $OUT/bench.log (BENCH_ARGS replaces the default flags).
# Stages can be skipped: STAGES="parity" (default "parity bench").
# Run: device tool, carry [".devcarry/cuda"], command `bash bench/cuda/moe_wire_check.sh`.
set -u
source bench/cuda/device_env.sh  # OUT, C, PKG, dev_configure, dev_build; carried deps unpacked
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
t0=$(date +%s)
dev_configure
dev_build strata_parity_test strata_bench_moe_bench
echo "build: $(( $(date +%s) - t0 )) s"
for stage in ${STAGES:-parity bench}; do
  case $stage in
    parity)
      for suite in 'MoeBackend.*' '*MoeModel.*' '*QuantModel.*:QuantWeightBytes.*:QuantLinear.*' 'MoeParity.ExpertsMatchCpu'; do
        name=$(echo "$suite" | sed 's/[.*:]/_/g; s/__*/_/g; s/_$//')
        t1=$(date +%s)
        timeout ${PARITY_TIMEOUT:-120} ./build-dev/strata_parity_test --gtest_filter="$suite" >"$OUT/parity_$name.log" 2>&1
        echo "parity $suite: rc $? ($(( $(date +%s) - t1 )) s)"
        grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure|CHECK failed|CUDA: |Expected|Which is|runs on the CPU" \
          "$OUT/parity_$name.log" | head -30
      done
      # The measurements the bounds rest on: worst expert NMSEs, near-ties, fixture logits.
      grep -hE "^experts " "$OUT"/parity_MoeBackend*.log | awk '{print $NF, $0}' | sort -g -r | cut -d' ' -f2- | head -6
      grep -hE "^route .*near-ties [1-9]|^twin |^router .*T 512" "$OUT"/parity_MoeBackend*.log | head -12
      grep -hE "routed tokens|long0" "$OUT"/parity_MoeModel*.log
      grep -hE "chunk [0-9]+: nmse|greedy:|ran on the CPU twin" "$OUT"/parity_QuantModel*.log | head -40 ;;
    bench)
      t1=$(date +%s)
      timeout ${BENCH_TIMEOUT:-150} ./build-dev/strata_bench_moe_bench ${BENCH_ARGS:---what backend --tokens 1,8,64,4096} \
        >"$OUT/bench.log" 2>&1
      echo "bench: rc $? ($(( $(date +%s) - t1 )) s)"
      grep -E "^(device|ceiling|backend)" "$OUT/bench.log" | head -40
      grep -E "CHECK failed|CUDA: " "$OUT/bench.log" | head -5 ;;
  esac
done
echo "total: $(( $(date +%s) - t0 )) s"
