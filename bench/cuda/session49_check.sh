#!/bin/bash
# Prepared in session 48 for the next device call (not yet run). Built on the GPU machine; carry
# .devcarry/llfx (bash bench/cuda/make_carry.sh llfx) and the tree without
# tests/fixtures/hidden_states/*.safetensors (restore: git checkout -- tests/fixtures).
#   1. parity: the decode kernels, and the Llama fixture suites with session 48's last form of the
#      merged rope + decode launch (its call 9 ran the kernel tests only);
#   2. decode attention's split floor (decode_min_split_tokens, variants decode_split_tokens256 /
#      512 / 1024 against the default 64): Llama-3.1-8B W4A16 at batch 1, contexts 512, 2,048 and
#      4,096, and batch 16 at 2,048, alternating, two processes;
#   3. on an H200: session48f_check.sh's rows (Llama W4A16 batch 1, the Kimi rank and Moonlight,
#      MLA acceptance), which every session-48 call missed (each got an H100).
set -u
STRATA_CARRY=$PWD/.devcarry/llfx source bench/cuda/device_env.sh
dev_begin strata_parity_test strata_bench_kit
L=$OUT BIN=./build-dev
dev_parity ops "CudaParity.DecodeAttention*:CudaParity.DecodeRopeFusion:KvFp8.DecodeAttention*" 120
dev_parity models "Fixtures/CudaModel.*:Fixtures/QuantModel.*:CudaModelGreedy.*:CudaModelLong.*:CudaEagle3.*:*house_llama*:PromptLogprobsParity.*" 400
grep -E "greedy tokens equal|argmax agreement [0-9]+ /|eagle3 cuda" "$OUT/parity_models.log" | cut -c1-150 | head -12
echo "[parity @$(( $(date +%s) - t0 )) s]"
CFG=$C/shared/configs
V=decode_split_tokens256,defaults,decode_split_tokens512,defaults,decode_split_tokens1024,defaults
step() {  # BATCH CONTEXT TAG
  timeout 150 ./build-dev/strata_bench_kit rank_step_bench --config "$CFG/llama-3.1-8b-w4a16/config.json" \
    --batches "$1" --context "$2" --prefill 0 --reps 50 --variants "$V" >"$OUT/w4a16_b$1_c$2_$3.log" 2>&1
  grep -E "^decode|^variant" "$OUT/w4a16_b$1_c$2_$3.log" | sed "s/^/b$1 c$2 /" | cut -c1-120
}
for i in 1 2; do
  for ctx in 512 2048 4096; do step 1 $ctx $i; done
  step 16 2048 $i
  echo "[round $i @$(( $(date +%s) - t0 )) s]"
done
if [[ $gpu == *H200* ]]; then
  STRATA_CARRY=$C OUT=$OUT/rows bash bench/cuda/session48f_check.sh
fi
echo "[session49_check total @$(( $(date +%s) - t0 )) s]"
tar czf /tmp/logs.tgz -C "$OUT" . && mv /tmp/logs.tgz "$OUT/" && find "$OUT" -maxdepth 1 -name "*.log" -delete
