#!/bin/bash
# Session 48's fifth device call: the new defaults (decode_early_kv, decode_rope_fusion, the norm
# prologues' weights held) through the suites, and the batch-1 / batched steps A/B. Built on the
# GPU machine; carry .devcarry/llfx and the tree without tests/fixtures/hidden_states/house-mla.*
# (restore: git checkout -- tests/fixtures).
#   1. parity: decode, rope, fused and norm kernels; the fixture suites (tiny Llama/Qwen and W4A16
#      against HF, house-llama greedy eager and graphs against the CPU backend, the long argmax,
#      EAGLE-3) and house-llama's capture, tree and engine suites;
#   2. rank_step_bench: Llama-3.1-8B W4A16 at batches 1, 16, 64 and bf16 at 1, 64: the defaults
#      beside no_decode_rope_fusion and no_decode_early_kv, alternating, two processes each;
#      Moonlight at batch 1.
set -u
STRATA_CARRY=$PWD/.devcarry/llfx source bench/cuda/device_env.sh
dev_begin strata_parity_test strata_bench_kit
L=$OUT BIN=./build-dev
dev_parity ops "CudaParity.DecodeRopeFusion:CudaParity.DecodeAttention*:KvFp8.DecodeAttention*:CudaFusedParity.*:CudaParity.Rope*:Int4AddNorm.*:GemvNorm.*:CudaParity.RmsNorm*" 240
dev_parity models "Fixtures/CudaModel.*:Fixtures/QuantModel.*:CudaModelGreedy.*:CudaModelLong.*:CudaEagle3.*:*house_llama*:PromptLogprobsParity.*:CudaSampling.*" 400
grep -E "greedy tokens equal|argmax agreement [0-9]+ /|eagle3 cuda" "$OUT/parity_models.log" | cut -c1-150 | head -12
echo "[parity @$(( $(date +%s) - t0 )) s]"
CFG=$C/shared/configs
step() {  # CONFIG BATCHES CONTEXT VARIANTS TAG
  timeout 200 ./build-dev/strata_bench_kit rank_step_bench --config "$CFG/$1/config.json" --batches "$2" \
    --context "$3" --prefill 0 --reps 50 --variants "$4" >"$OUT/${1}_$5.log" 2>&1
  grep -E "^decode|^variant" "$OUT/${1}_$5.log" | sed "s/^/$1 /" | cut -c1-125
}
V=no_decode_rope_fusion,defaults,no_decode_early_kv,defaults,no_decode_rope_fusion,defaults
for i in 1 2; do
  step llama-3.1-8b-w4a16 1,16,64 512 $V $i
  step llama-3.1-8b 1,64 512 $V $i
  echo "[round $i @$(( $(date +%s) - t0 )) s]"
done
step moonlight-16b-a3b 1 768 defaults m
echo "[session48e_check total @$(( $(date +%s) - t0 )) s]"
tar czf /tmp/logs.tgz -C "$OUT" . && mv /tmp/logs.tgz "$OUT/" && find "$OUT" -maxdepth 1 -name "*.log" -delete
