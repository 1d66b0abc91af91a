#!/bin/bash
# Session 43's fourth call (carry .devcarry/k43d — strata_parity_test and strata_bench_kit with
# RMSNorm's bf16 weights loaded before its PDL wait, CudaTunables::norm_weight_preload, off by
# default — and .devcarry/fxs): the norm suites with it, then the batch-1 steps whose norms are
# one block each on the critical path (Llama-3.1-8B W4A16 and bf16, a Kimi-K2.5 rank, Moonlight)
# with it against the default in the same processes, two processes each. On an H200 also the
# readings main owes (owed_h200_check.sh).
set -u
OUT=${OUT:-/tmp/strata_out}
mkdir -p "$OUT"
t0=$(date +%s)
PREBUILT=${PREBUILT:-k43d}
source bench/cuda/prebuilt.sh unpack "$PREBUILT" || exit 1
prebuilt_link_shared "$PWD/.devcarry/fxs"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader)
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
L=$OUT BIN=$PB
STRATA_CARRY=$PWD/.devcarry/fxs source bench/cuda/device_env.sh  # dev_parity
dev_parity norm "${PARITY_FILTER:-CudaParity.RmsNorm*:GemvNorm.*:MoeCombineNorm.*:*QuantModel*:Fixtures/MlaModel.*/deepseek*}" ${PARITY_TIMEOUT:-200}
V=${VARIANTS:-norm_preload}
for i in 1 2; do
  for cfg in llama-3.1-8b-w4a16 llama-3.1-8b; do
    OUT=$OUT/$cfg-$i STRATA_CARRY=$PWD/.devcarry/fxs PREBUILT=$PREBUILT STAGES=llama \
      LLAMA_CONFIG=$cfg LLAMA_VARIANTS=$V bash bench/cuda/session10_check.sh 2>&1 |
      grep -E "^decode|^variant" | cut -c1-170
  done
  OUT=$OUT/rank-$i STRATA_CARRY=$PWD/.devcarry/fxs PREBUILT=$PREBUILT STAGES="kimi moonlight" \
    KIMI_CUTS="4 12" KIMI_BATCHES=1 KIMI_VARIANTS=$V MOONLIGHT_VARIANTS=$V \
    bash bench/cuda/session10_check.sh 2>&1 | grep -E "^kimi 61|^decode|^variant" | cut -c1-170
  echo "[run $i @$(( $(date +%s) - t0 )) s]"
done
if [[ $gpu == *H200* ]]; then
  LLAMA_CONFIG=llama-3.1-8b-w4a16 CARRY=$PWD/.devcarry/fxs MLA_RUNS=2 PREBUILT=$PREBUILT \
    STEP_STAGES="kimi moonlight" KIMI_BATCHES=1 MOE_RUNS=1 bash bench/cuda/owed_h200_check.sh
fi
echo "[session43d_check total @$(( $(date +%s) - t0 )) s]"
