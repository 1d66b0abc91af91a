#!/bin/bash
# Next steps for the one-GPU offline target (issue 6), on the GPU machine from the repository root
# (carry .devcarry/cuda):
#   1. strata_bench_overlap_bench: one decode step's GEMMs and attention alone, together on the
#      whole GPU, and together with the SMs split by green contexts (OVERLAP_ARGS, one argument
#      list per line; default: bf16 at 280 rows and fp8_e4m3 at 500, context 1,536);
#   2. with CLOCKS=1, the offline fp8 run for CLOCK_SECONDS (default 60) with nvidia-smi sampling
#      SM clock, power and throttle reasons every second: are the engine's hot steps slower than
#      the cool breakdown because the clocks drop?
set -u
source bench/cuda/device_env.sh  # OUT, C, PKG, dev_configure, dev_build
t0=$(date +%s)
dev_configure -DSTRATA_TESTS=OFF
dev_build strata_bench_overlap_bench strata_bench_offline_bench
echo "build: $(( $(date +%s) - t0 )) s"
ARGS=${OVERLAP_ARGS:-"--batch 280 --kv bf16
--batch 500 --kv fp8_e4m3"}
while IFS= read -r args; do
  [ -z "$args" ] && continue
  ./build-dev/strata_bench_overlap_bench $args >>"$OUT/overlap.log" 2>&1
  echo "overlap_bench $args (rc $?)"
done <<<"$ARGS"
grep -E "^overlap|CHECK|rror" "$OUT/overlap.log" | cut -c1-260
if [ "${CLOCKS:-0}" = 1 ]; then
  nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active \
    --format=csv -lms 1000 >"$OUT/smi.csv" &
  smi=$!
  STRATA_STEP_TIMING=1 ./build-dev/strata_bench_offline_bench --config $C/shared/configs/llama-3.1-8b/config.json \
    --tokenizer $C/shared/models/house-llama --breakdown-batch 0 --kv-cache-dtype fp8_e4m3 --mem-fraction 0.92 \
    --max-seconds "${CLOCK_SECONDS:-60}" >"$OUT/clocks_run.log" 2>&1
  kill $smi
  grep -E "^progress|engine steps|eager steps" "$OUT/clocks_run.log" | cut -c1-200
  awk -F, 'NR == 1 || NR % 4 == 0' "$OUT/smi.csv" | head -40
fi
echo "total: $(( $(date +%s) - t0 )) s"
