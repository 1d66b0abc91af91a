#!/bin/bash
# Session 44's call (carry .devcarry/k45 — strata_parity_test and strata_bench_kit at main +
# RMSNorm's bf16 weights before its PDL wait, CudaTunables::norm_weight_preload, off, and the
# row kernel's dims to 32,768 — and .devcarry/fxs):
#   1. on an H200 first: mla_h200_ab.sh (the MLA decode defaults sessions 40-41 took on H100
#      evidence: L2 prefetch one chunk ahead, two S groups);
#   2. the norm suites (RmsNormAndResidual now runs 16,384 and 24,576 and checks the preload's
#      bits against the plain load);
#   3. the batch-1 steps whose norms are one block each on the critical path (Llama-3.1-8B
#      W4A16 and bf16, a Kimi-K2.5 rank, Moonlight), norm_preload against the `defaults` control
#      twice each in one process, two processes (RUNS). (Calls 2-3 ran k45, the preload off by
#      default, with VARIANTS=norm_preload,defaults,norm_preload,defaults; main has it on, and the
#      default here is its A/B, no_norm_preload, with PREBUILT=k48.)
set -u
OUT=${OUT:-/tmp/strata_out}
mkdir -p "$OUT"
t0=$(date +%s)
PREBUILT=${PREBUILT:-k48}
source bench/cuda/prebuilt.sh unpack "$PREBUILT" || exit 1
prebuilt_link_shared "$PWD/.devcarry/fxs"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader)
if [[ $gpu == *H200* ]]; then
  OUT=$OUT/mla PREBUILT=$PREBUILT bash bench/cuda/mla_h200_ab.sh 2>&1 | grep -v "NMSE" | cut -c1-200
fi
L=$OUT BIN=$PB
STRATA_CARRY=$PWD/.devcarry/fxs source bench/cuda/device_env.sh  # dev_parity
dev_parity norm "${PARITY_FILTER:-CudaParity.RmsNorm*:GemvNorm.*:MoeCombineNorm.*:*QuantModel*}" \
  ${PARITY_TIMEOUT:-200}
V=${VARIANTS:-no_norm_preload,defaults,no_norm_preload,defaults}
for i in $(seq 1 "${RUNS:-2}"); do
  for cfg in llama-3.1-8b-w4a16 llama-3.1-8b; do
    OUT=$OUT/$cfg-$i STRATA_CARRY=$PWD/.devcarry/fxs PREBUILT=$PREBUILT STAGES=llama \
      LLAMA_CONFIG=$cfg LLAMA_VARIANTS=$V bash bench/cuda/session10_check.sh 2>&1 |
      grep -E "^decode|^variant" | cut -c1-120
  done
  OUT=$OUT/rank-$i STRATA_CARRY=$PWD/.devcarry/fxs PREBUILT=$PREBUILT STAGES="kimi moonlight" \
    KIMI_CUTS="4 12" KIMI_BATCHES=1 KIMI_VARIANTS=$V MOONLIGHT_VARIANTS=$V \
    bash bench/cuda/session10_check.sh 2>&1 | grep -E "^kimi 61|^decode|^variant" | cut -c1-120
  echo "[run $i @$(( $(date +%s) - t0 )) s]"
done
echo "[session44_check total @$(( $(date +%s) - t0 )) s]"
