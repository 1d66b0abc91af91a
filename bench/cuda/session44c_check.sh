#!/bin/bash
# Session 44's third call (carry .devcarry/k48 — strata_parity_test and strata_bench_kit at main
# with the router's and RMSNorm's weights before their PDL waits by default — and .devcarry/fxs):
#   1. the router, MoE, norm and DeepSeek-architecture fixture suites with the new defaults;
#   2. on an H200: mla_h200_ab.sh;
#   3. a Kimi-K2.5 rank and Moonlight at batch 1: no_router_preload, no_norm_preload and
#      mla_inputs_prefetch (the MLA inputs kernel's norm weights into L2 before its wait: Moonlight's
#      batch-1 path) against a no-change control, each twice in one process (RUNS processes).
set -u
OUT=${OUT:-/tmp/strata_out}
mkdir -p "$OUT"
t0=$(date +%s)
PREBUILT=${PREBUILT:-k48}
source bench/cuda/prebuilt.sh unpack "$PREBUILT" || exit 1
prebuilt_link_shared "$PWD/.devcarry/fxs"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader)
L=$OUT BIN=$PB
STRATA_CARRY=$PWD/.devcarry/fxs source bench/cuda/device_env.sh  # dev_parity
dev_parity moe "${PARITY_FILTER:-MoeParity.*:MoeBackend.*:SideBranch.*:MoeCombineNorm.*:MoeDownCombine.*:CudaParity.RmsNorm*:*QuantModel*:Fixtures/MlaModel.*/deepseek*-*HouseMla*:*house_mla*}" \
  ${PARITY_TIMEOUT:-240}
if [[ $gpu == *H200* ]]; then
  OUT=$OUT/mla PREBUILT=$PREBUILT bash bench/cuda/mla_h200_ab.sh 2>&1 | grep -v "NMSE" | cut -c1-200
fi
V1=no_router_preload,no_norm_preload,mla_inputs_prefetch,defaults
V=${VARIANTS:-$V1,$V1}
for i in $(seq 1 "${RUNS:-1}"); do
  OUT=$OUT/rank-$i STRATA_CARRY=$PWD/.devcarry/fxs PREBUILT=$PREBUILT STAGES="kimi moonlight" \
    KIMI_CUTS="4 12" KIMI_BATCHES=1 KIMI_VARIANTS=$V MOONLIGHT_VARIANTS=$V \
    bash bench/cuda/session10_check.sh 2>&1 | grep -E "^kimi 61|^decode|^variant" | cut -c1-110
  echo "[run $i @$(( $(date +%s) - t0 )) s]"
done
echo "[session44c_check total @$(( $(date +%s) - t0 )) s]"
