#!/bin/bash
# Session 45's last call (carry .devcarry/k50 — strata_parity_test and strata_bench_kit with
# int4_add_norm_fusion on by default — and .devcarry/fxs):
#   1. parity: Int4AddNorm.* (on the shared merge helper now), the norm, W4A16 and quantized-model
#      suites, and the MoE / DeepSeek fixture suites, all with the new default;
#   2. Llama-3.1-8B W4A16 at batch 1: no_int4_add_norm against a no-change control, twice;
#   3. on an H200 (none came in session 44 or 45 until then): mla_h200_ab.sh — the MLA decode
#      defaults, and a Kimi-K2.5 rank and Moonlight at batch 1 with every default of sessions 44-45.
set -u
OUT=${OUT:-/tmp/strata_out}
mkdir -p "$OUT"
t0=$(date +%s)
PREBUILT=${PREBUILT:-k50}
source bench/cuda/prebuilt.sh unpack "$PREBUILT" || exit 1
prebuilt_link_shared "$PWD/.devcarry/fxs"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader)
echo "gpu: $gpu"
L=$OUT BIN=$PB
STRATA_CARRY=$PWD/.devcarry/fxs source bench/cuda/device_env.sh  # dev_parity
dev_parity add_norm "Int4AddNorm.*:GemvNorm.*:CudaParity.RmsNorm*:Int4Parity.*:QuantLinear.*" 180
grep -E "^int4 add norm" "$OUT/parity_add_norm.log"
dev_parity moe "MoeParity.*:MoeBackend.*:SideBranch.*:MoeCombineNorm.*:MoeDownCombine.*:*QuantModel*:Fixtures/MlaModel.*/deepseek*-*HouseMla*:*house_mla*" 240
echo "[parity @$(( $(date +%s) - t0 )) s]"
OUT=$OUT/llama STRATA_CARRY=$PWD/.devcarry/fxs PREBUILT=$PREBUILT STAGES=llama \
  LLAMA_CONFIG=llama-3.1-8b-w4a16 LLAMA_VARIANTS=no_int4_add_norm,defaults,no_int4_add_norm,defaults \
  bash bench/cuda/session10_check.sh 2>&1 | grep -E "^decode|^variant" | cut -c1-110
if [[ $gpu == *H200* ]]; then
  OUT=$OUT/mla PREBUILT=$PREBUILT bash bench/cuda/mla_h200_ab.sh 2>&1 | grep -v "NMSE" |
    grep -E "^ceiling|^acc|^pf0|^mla|^kimi 61|^decode|^variant|^\[" | cut -c1-200
fi
echo "[session45c_check total @$(( $(date +%s) - t0 )) s]"
