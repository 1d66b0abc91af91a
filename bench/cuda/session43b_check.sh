#!/bin/bash
# Session 43's second call (carry .devcarry/k43 — strata_parity_test and strata_bench_kit with the
# MLA decode kernel's cluster merge, CudaTunables::mla_cluster_merge, off by default — and
# .devcarry/fxs): the MLA suites with it (MlaAttention.DecodeClusterMerge: one cluster and
# several, every merge form beside it), then a Kimi-K2.5 rank's step at batch 1 / 2 and
# Moonlight's at batch 1 with clusters of up to 8 and 16 against the merge kernel, in two
# processes, the second with the Kimi rank's timeline (CUPTI) of the defaults and clusters of 8.
set -u
OUT=${OUT:-/tmp/strata_out}
mkdir -p "$OUT"
t0=$(date +%s)
PREBUILT=${PREBUILT:-k43}
source bench/cuda/prebuilt.sh unpack "$PREBUILT" || exit 1
prebuilt_link_shared "$PWD/.devcarry/fxs"
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
L=$OUT BIN=$PB
STRATA_CARRY=$PWD/.devcarry/fxs source bench/cuda/device_env.sh  # dev_parity
dev_parity mla "${PARITY_FILTER:-MlaAttention.DecodeClusterMerge:MlaAttention.DecodeFusedMerge:MlaAttention.DecodeEveryLayout:MlaAttention.DecodeCappedSplits:MlaBackend.*:Fixtures/MlaModel.*/deepseek*}" ${PARITY_TIMEOUT:-240}
grep -E "clusters of" "$OUT/parity_mla.log" | cut -c1-230 | head -40
for i in 1 2; do
  extra=""
  [ "$i" = 2 ] && extra="--timeline 1 --timeline-variants mla_cluster8"
  OUT=$OUT/run$i RANK_EXTRA="$extra" STRATA_CARRY=$PWD/.devcarry/fxs PREBUILT=$PREBUILT \
    STAGES="kimi moonlight" KIMI_CUTS="4 12" KIMI_BATCHES=1,2 \
    KIMI_VARIANTS=${VARIANTS:-mla_cluster8,mla_cluster16} \
    MOONLIGHT_VARIANTS=${VARIANTS:-mla_cluster8,mla_cluster16} bash bench/cuda/session10_check.sh
  echo "[run $i @$(( $(date +%s) - t0 )) s]"
done
echo "[session43b_check total @$(( $(date +%s) - t0 )) s]"
