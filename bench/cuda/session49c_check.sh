#!/bin/bash
# Session 49, call 3: decode attention's split-KV target at one block an SM, rounded down (the
# new default, decode_blocks_per_sm 1), against the old four (decode_bps4; the old rule rounded
# up, which at four an SM gives the same splits on these shapes but batch 4) and two. Carry
# .devcarry/llfx and the tree without tests/fixtures/hidden_states/*.safetensors; built on the
# GPU machine.
#   1. parity: the decode kernels and the Llama fixture suites under the new split counts;
#   2. Llama-3.1-8B W4A16 at batch 1 (512 / 2,048 / 4,096 / 16,384 keys), 4 and 16 (2,048 /
#      4,096), 64 (2,048); bf16 and Qwen2.5-7B at batch 1 / 16, 4,096 keys; alternating, two
#      rounds; 3. on an H200, session48f_check.sh's rows.
set -u
STRATA_CARRY=${STRATA_CARRY:-$PWD/.devcarry/llfx} source bench/cuda/device_env.sh
dev_begin strata_parity_test strata_bench_kit
L=$OUT BIN=./build-dev
dev_parity ops "CudaParity.DecodeAttention*:CudaParity.DecodeRopeFusion:KvFp8.DecodeAttention*" 120
dev_parity models "Fixtures/CudaModel.*:Fixtures/QuantModel.*:CudaModelGreedy.*:CudaModelLong.*:CudaEagle3.*:*house_llama*:PromptLogprobsParity.*" 400
grep -E "greedy tokens equal|argmax agreement [0-9]+ /|eagle3 cuda" "$OUT/parity_models.log" | cut -c1-150 | head -12
echo "[parity @$(( $(date +%s) - t0 )) s]"
CFG=$C/shared/configs
V=decode_bps4,defaults,decode_bps2,defaults
step() {  # CONFIG BATCH CONTEXT TAG
  local log="$OUT/$1_b$2_c$3_$4.log"
  timeout 200 ./build-dev/strata_bench_kit rank_step_bench --config "$CFG/$1/config.json" \
    --batches "$2" --context "$3" --prefill 0 --reps 50 --variants "$V" >"$log" 2>&1
  grep -E "^decode|^variant" "$log" | sed "s/^/$1 b$2 c$3 /" | cut -c1-130
}
for i in 1 2; do
  for ctx in 512 2048 4096 16384; do step llama-3.1-8b-w4a16 1 $ctx $i; done
  for b in 4 16; do for ctx in 2048 4096; do step llama-3.1-8b-w4a16 $b $ctx $i; done; done
  step llama-3.1-8b-w4a16 64 2048 $i
  for b in 1 16; do step llama-3.1-8b $b 4096 $i; step qwen2.5-7b $b 4096 $i; done
  echo "[round $i @$(( $(date +%s) - t0 )) s]"
done
if [[ $gpu == *H200* ]]; then
  STRATA_CARRY=$C OUT=$OUT/rows timeout $(( 570 - $(date +%s) + t0 )) bash bench/cuda/session48f_check.sh
fi
echo "[session49c_check total @$(( $(date +%s) - t0 )) s]"
tar czf /tmp/logs.tgz -C "$OUT" . && mv /tmp/logs.tgz "$OUT/" && find "$OUT" -maxdepth 1 -name "*.log" -delete
