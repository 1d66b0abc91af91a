#!/bin/bash
# Session 49, call 2: decode attention's split-KV target (decode_blocks_per_sm, then 4) against
# the split floor (its variant decode_bps1 became the rule's first half; the name is gone).
# Call 1 (session49_check.sh) found splits of >= 256 / 512 / 1,024 keys faster
# than the default's 64 wherever the default made more blocks than ~1 an SM (batch 1 at 2,048 /
# 4,096 keys: −4 / −9%; batch 16 at 2,048: −6.5%), and slower at 512 keys (+3.5 to +11%, fewer
# blocks than SMs). So the target itself is what to move. Carry .devcarry/bench (configs and debs;
# rank_step_bench makes its weights); built on the GPU machine.
#   Llama-3.1-8B W4A16 batch 1 at 512 / 2,048 / 4,096 / 16,384 keys, batch 4 and 16 at 2,048 and
#   4,096, batch 64 at 2,048; bf16 Llama batch 1 at 4,096; Qwen2.5-7B (4 KV heads) batch 1 at
#   4,096. Variants decode_bps1 / decode_bps2 / decode_bps1_split256 each beside `defaults`.
#   On an H200, session48f_check.sh's rows too.
set -u
STRATA_CARRY=${STRATA_CARRY:-$PWD/.devcarry/bench} source bench/cuda/device_env.sh
dev_begin strata_bench_kit
CFG=$C/shared/configs
V=decode_bps1,defaults,decode_bps2,defaults,decode_bps1_split256,defaults
step() {  # CONFIG BATCH CONTEXT TAG
  local log="$OUT/$1_b$2_c$3_$4.log"
  timeout 200 ./build-dev/strata_bench_kit rank_step_bench --config "$CFG/$1/config.json" \
    --batches "$2" --context "$3" --prefill 0 --reps 50 --variants "$V" >"$log" 2>&1
  grep -E "^decode|^variant" "$log" | sed "s/^/$1 b$2 c$3 /" | cut -c1-150
}
for i in 1 2; do
  for ctx in 512 2048 4096 16384; do step llama-3.1-8b-w4a16 1 $ctx $i; done
  for b in 4 16; do for ctx in 2048 4096; do step llama-3.1-8b-w4a16 $b $ctx $i; done; done
  step llama-3.1-8b-w4a16 64 2048 $i
  step llama-3.1-8b 1 4096 $i
  step qwen2.5-7b 1 4096 $i
  echo "[round $i @$(( $(date +%s) - t0 )) s]"
done
if [[ $gpu == *H200* ]]; then
  STRATA_CARRY=$C OUT=$OUT/rows timeout $(( 570 - $(date +%s) + t0 )) bash bench/cuda/session48f_check.sh
fi
echo "[session49b_check total @$(( $(date +%s) - t0 )) s]"
tar czf /tmp/logs.tgz -C "$OUT" . && mv /tmp/logs.tgz "$OUT/" && find "$OUT" -maxdepth 1 -name "*.log" -delete
