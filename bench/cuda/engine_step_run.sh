#!/bin/bash
# Small-batch decode through the engine vs the benchmark's loop (issue 6), on the GPU machine from
# the repository root (carry .devcarry/cuda):
#   1. strata_bench_offline_bench at each of BATCHES (default "1 8"; prompts = batch, 512 in /
#      256 out), graphs off and on, STRATA_STEP_TIMING=1: the engine's split of a step into
#      forward + sampling and host-only work, and the backend's graph counters at shutdown;
#   2. llama_bench --what ceilings,decode (DECODE_MODES, default "3,4"): the benchmark's own loop,
#      with the host's recording and flush time per token.
# EXTRA_OFFLINE: one more offline_bench argument list to run at the end (e.g. a full workload).
set -u
source bench/cuda/device_env.sh  # OUT, C, PKG, dev_configure, dev_build
t0=$(date +%s)
dev_configure -DSTRATA_TESTS=OFF
dev_build strata_bench_offline_bench strata_bench_llama_bench
echo "build: $(( $(date +%s) - t0 )) s"
OB="./build-dev/strata_bench_offline_bench --config $C/shared/configs/llama-3.1-8b/config.json --tokenizer $C/shared/models/house-llama"
for bs in ${BATCHES:-1 8}; do
  for g in 0 $bs; do
    STRATA_STEP_TIMING=1 $OB --prompts $bs --in 512 --out 256 --breakdown-batch 0 --cuda-graph-max-bs $g \
      >"$OUT/offline_b${bs}_g$g.log" 2>&1
    echo "batch $bs, --cuda-graph-max-bs $g (rc $?):"
    grep -E "^offline|engine steps|CUDA graphs" "$OUT/offline_b${bs}_g$g.log" | sed 's/^/  /'
  done
done
DECODE_MODES=${DECODE_MODES:-3,4} ./build-dev/strata_bench_llama_bench --what ceilings,decode >"$OUT/bench.log" 2>&1
echo "llama_bench: rc $?"
grep -E "ceiling|decode|graphs" "$OUT/bench.log"
if [ -n "${EXTRA_OFFLINE:-}" ]; then
  STRATA_STEP_TIMING=1 $OB $EXTRA_OFFLINE >"$OUT/offline_extra.log" 2>&1
  echo "offline $EXTRA_OFFLINE (rc $?):"
  grep -E "^offline|CUDA graphs" "$OUT/offline_extra.log"
fi
echo "total: $(( $(date +%s) - t0 )) s"
