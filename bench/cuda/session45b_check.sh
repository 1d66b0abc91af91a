#!/bin/bash
# Session 45's second call (carry .devcarry/k49 — strata_parity_test and strata_bench_kit with
# int4_add_norm_fusion, off by default then — and .devcarry/fxs; as run: the fusion is the
# default since, and its A/B variant is now no_int4_add_norm):
#   1. parity: Int4AddNorm.* (the add_rms_norm split between two W4A16 GEMVs, bit for bit the
#      three launches), the W4A16 and norm suites, and the MoE / DeepSeek fixture suites with the
#      router's and RMSNorm's weights before their PDL waits (the defaults since session 44);
#   2. Llama-3.1-8B W4A16 at batch 1: int4_add_norm against a no-change control, each twice in a
#      process (RUNS processes); bf16 8B once (the merges take W4A16 GEMVs only: a control);
#   3. on an H200: mla_h200_ab.sh (the MLA decode defaults, owed since session 43).
set -u
OUT=${OUT:-/tmp/strata_out}
mkdir -p "$OUT"
t0=$(date +%s)
PREBUILT=${PREBUILT:-k49}
source bench/cuda/prebuilt.sh unpack "$PREBUILT" || exit 1
prebuilt_link_shared "$PWD/.devcarry/fxs"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader)
echo "gpu: $gpu"
L=$OUT BIN=$PB
STRATA_CARRY=$PWD/.devcarry/fxs source bench/cuda/device_env.sh  # dev_parity
dev_parity add_norm "Int4AddNorm.*:GemvNorm.*:CudaParity.RmsNorm*:Int4Parity.*:QuantLinear.*" 180
grep -E "^int4 add norm" "$OUT/parity_add_norm.log"
dev_parity moe "${PARITY_FILTER:-MoeParity.*:MoeBackend.*:SideBranch.*:MoeCombineNorm.*:MoeDownCombine.*:*QuantModel*:Fixtures/MlaModel.*/deepseek*-*HouseMla*:*house_mla*}" \
  ${PARITY_TIMEOUT:-240}
echo "[parity @$(( $(date +%s) - t0 )) s]"
V=int4_add_norm,defaults,int4_add_norm,defaults
for i in $(seq 1 "${RUNS:-2}"); do
  OUT=$OUT/llama-$i STRATA_CARRY=$PWD/.devcarry/fxs PREBUILT=$PREBUILT STAGES=llama \
    LLAMA_CONFIG=llama-3.1-8b-w4a16 LLAMA_VARIANTS=$V bash bench/cuda/session10_check.sh 2>&1 |
    grep -E "^decode|^variant" | cut -c1-120
  echo "[w4a16 $i @$(( $(date +%s) - t0 )) s]"
done
OUT=$OUT/llama-bf16 STRATA_CARRY=$PWD/.devcarry/fxs PREBUILT=$PREBUILT STAGES=llama \
  LLAMA_VARIANTS=$V bash bench/cuda/session10_check.sh 2>&1 | grep -E "^decode|^variant" | cut -c1-120
echo "[bf16 @$(( $(date +%s) - t0 )) s]"
if [[ $gpu == *H200* && ${MLA:-1} == 1 ]]; then
  OUT=$OUT/mla PREBUILT=$PREBUILT bash bench/cuda/mla_h200_ab.sh 2>&1 | grep -v "NMSE" |
    grep -E "^ceiling|^acc|^pf0|^mla|^kimi 61|^decode|^variant|^\[" | cut -c1-200
fi
echo "[session45b_check total @$(( $(date +%s) - t0 )) s]"
