#!/bin/bash
# Split-KV prefill attention (attention_prefill_split.cu) on the GPU machine (the device tool),
# from the repository root, in one call: builds the parity tests and the two benchmarks, runs the
# attention parity suites (the split-KV tests and the regular kernels'), the model parity suites
# with the split path forced on (STRATA_CUDA_PREFILL_SPLIT=2), the chunk attention benchmark
# (regular kernels vs split-KV: llama_bench --what attention-chunk) and, with TTFT=1 (default),
# the host-tier time to first token of a 32,768-token prompt (hicache_bench --what ttft).
# Carry: .devcarry/cuda (debs/ and shared/). Logs go to $OUT.
set -u
source bench/cuda/device_env.sh  # OUT, C, PKG, dev_configure, dev_build; carried deps unpacked
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
t0=$(date +%s)
dev_configure
dev_build strata_parity_test strata_bench_llama_bench strata_bench_hicache_bench
echo "build: $(( $(date +%s) - t0 )) s"
timeout ${PARITY_S:-150} ./build-dev/strata_parity_test \
  --gtest_filter=${PARITY_FILTER:-CudaParity.*Attention*:KvFp8.*Attention*} >"$OUT/parity.log" 2>&1
echo "parity: exit status $?, $(( $(date +%s) - t0 )) s"
grep -E "FAILED|Failure|Expected|Which is|actual" "$OUT/parity.log" | head -30
grep -E "^\[  PASSED|^\[  FAILED|tests ran" "$OUT/parity.log"
# The split tests' errors (the lines after each split test's start).
awk '/RUN .*SplitKv/{on=1} /OK .*SplitKv|FAILED .*SplitKv/{print; on=0} on && /nmse/' "$OUT/parity.log" |
  sed 's/attention //' | head -40
if [ "${MODEL:-1}" = 1 ]; then
  STRATA_CUDA_PREFILL_SPLIT=2 timeout ${MODEL_S:-120} ./build-dev/strata_parity_test \
    --gtest_filter='*CudaModel*' >"$OUT/model_parity.log" 2>&1
  echo "model parity (split forced): exit status $?, $(( $(date +%s) - t0 )) s"
  grep -E "FAILED|Failure|^\[  PASSED|greedy tokens equal|max abs|nmse" "$OUT/model_parity.log" | head -24
fi
[ "${BENCH:-1}" = 1 ] &&
  timeout ${BENCH_S:-120} ./build-dev/strata_bench_llama_bench --what attention-chunk >"$OUT/bench.log" 2>&1
echo "bench: exit status $?, $(( $(date +%s) - t0 )) s"
grep -E "^ceiling" "$OUT/bench.log"
grep -E "^chunk" "$OUT/bench.log"
if [ "${TTFT:-1}" = 1 ]; then
  timeout ${TTFT_S:-150} ./build-dev/strata_bench_hicache_bench --what ttft --prompt 32768 \
    >"$OUT/ttft.log" 2>&1
  echo "ttft: exit status $?, $(( $(date +%s) - t0 )) s"
  grep -E "^ttft" "$OUT/ttft.log"
fi
echo "total: $(( $(date +%s) - t0 )) s"
