#!/bin/bash
# Session 48's second device call, built on the GPU machine (~100 s) at the tree with
# decode_early_kv on by default, the norm prologues' weights held in registers (M = 1) and
# decode_rope_fusion's copies after the PDL wait unless decode_early_kv (variant decode_rope_late).
# Carry .devcarry/llfx (debs, configs, fixtures tiny + house-llama, models/house-llama) and the
# tree without tests/fixtures/hidden_states/*.safetensors (restore: git checkout -- tests/fixtures).
#   1. parity: the decode and norm kernels' tests, then the fixture suites the defaults touch
#      (tiny Llama/Qwen and W4A16 against HF, house-llama greedy eager and graphs against the
#      CPU backend, the long argmax, EAGLE-3);
#   2. rank_step_bench at batch 1, Llama-3.1-8B W4A16 (two rounds) and bf16 (one): the defaults
#      beside no_decode_early_kv, no_int4_add_norm, decode_rope_fusion, decode_rope_late;
#   3. the W4A16 step's timeline, every kernel in start order, defaults against decode_rope_fusion
#      and decode_rope_late (why the merged launch read slower in session48_check.sh);
#   4. Moonlight at batch 1 (its norms: the held weights).
set -u
STRATA_CARRY=$PWD/.devcarry/llfx source bench/cuda/device_env.sh
dev_begin strata_parity_test strata_bench_kit
L=$OUT BIN=./build-dev
dev_parity ops "CudaParity.DecodeRopeFusion:CudaParity.DecodeAttention*:CudaFusedParity.*:KvFp8.DecodeAttention*:Int4AddNorm.*:GemvNorm.*:CudaParity.RmsNorm*" 240
grep "^decode rope fusion" "$OUT/parity_ops.log" | cut -c1-150
dev_parity models "Fixtures/CudaModel.*:Fixtures/QuantModel.*:CudaModelGreedy.*:CudaModelLong.*:CudaEagle3.*" 300
grep -E "greedy tokens equal|agree|argmax" "$OUT/parity_models.log" | cut -c1-150 | head -24
echo "[parity @$(( $(date +%s) - t0 )) s]"
CFG=$C/shared/configs
step() {  # CONFIG CONTEXT VARIANTS TAG [MORE ARGS]
  local cfg=$1 ctx=$2 var=$3 tag=$4
  shift 4
  timeout 150 ./build-dev/strata_bench_kit rank_step_bench --config "$CFG/$cfg/config.json" \
    --batches 1 --context "$ctx" --prefill 0 --reps 100 --variants "$var" "$@" \
    >"$OUT/${cfg}_$tag.log" 2>&1
  grep -E "^decode|^variant" "$OUT/${cfg}_$tag.log" | sed "s/^/$cfg /" | cut -c1-120
}
W=llama-3.1-8b-w4a16
V=no_decode_early_kv,defaults,decode_rope_fusion,defaults,decode_rope_late,defaults,no_int4_add_norm,defaults
for i in 1 2; do
  step $W 512 $V $i
  [ $i = 2 ] || step llama-3.1-8b 512 $V $i
  echo "[round $i @$(( $(date +%s) - t0 )) s]"
done
step $W 512 defaults t --timeline 2 --timeline-variants decode_rope_fusion,decode_rope_late
grep -E "^timeline|qkv_rope|decode_kernel|combine_kernel" "$OUT/${W}_t.log" | grep -v "^ *[0-9]" | cut -c1-150 | head -24
step moonlight-16b-a3b 768 defaults m
echo "[session48b_check total @$(( $(date +%s) - t0 )) s]"
tar czf "$OUT/logs.tgz" -C "$OUT" --exclude=logs.tgz . && find "$OUT" -maxdepth 1 -name "*.log" -delete
