#!/bin/bash
# Session 45's call (carry .devcarry/k48 — strata_parity_test and strata_bench_kit at main b8e74b2,
# the router's and RMSNorm's weights before their PDL waits by default — and .devcarry/fxs):
#   1. the router, MoE, norm and DeepSeek-architecture fixture suites with those defaults (owed
#      since session 44: its parity ran with the norm preload off);
#   2. on an H200: mla_h200_ab.sh (the MLA decode defaults L2 prefetch / two S groups, and a
#      Kimi-K2.5 rank and Moonlight at batch 1 with the defaults set explicitly, each twice);
#      on another GPU: mla_fp8_fixed_check.sh, one process (where fp8_flashmla's batch-64 call
#      spends its time: `mla_bench --what ceilings,fp8split,scaling`).
set -u
OUT=${OUT:-/tmp/strata_out}
mkdir -p "$OUT"
t0=$(date +%s)
PREBUILT=${PREBUILT:-k48}
source bench/cuda/prebuilt.sh unpack "$PREBUILT" || exit 1
prebuilt_link_shared "$PWD/.devcarry/fxs"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader)
echo "gpu: $gpu"
L=$OUT BIN=$PB
STRATA_CARRY=$PWD/.devcarry/fxs source bench/cuda/device_env.sh  # dev_parity
dev_parity moe "${PARITY_FILTER:-MoeParity.*:MoeBackend.*:SideBranch.*:MoeCombineNorm.*:MoeDownCombine.*:CudaParity.RmsNorm*:*QuantModel*:Fixtures/MlaModel.*/deepseek*-*HouseMla*:*house_mla*}" \
  ${PARITY_TIMEOUT:-240}
echo "[parity @$(( $(date +%s) - t0 )) s]"
if [[ $gpu == *H200* ]]; then
  OUT=$OUT/mla PREBUILT=$PREBUILT bash bench/cuda/mla_h200_ab.sh 2>&1 | grep -v "NMSE" |
    grep -E "^ceiling|^acc|^pf0|^mla|^kimi 61|^decode|^variant|^\[" | cut -c1-200
else
  OUT=$OUT/fp8 PREBUILT=$PREBUILT RUNS=1 bash bench/cuda/mla_fp8_fixed_check.sh 2>&1 | cut -c1-200
fi
echo "[session45_check total @$(( $(date +%s) - t0 )) s]"
