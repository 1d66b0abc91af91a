#!/bin/bash
# Session 44's second call (carry .devcarry/k46 — strata_parity_test and strata_bench_kit at main
# with RMSNorm's weights before its PDL wait by default — and .devcarry/fxs):
#   1. on an H200 first: mla_h200_ab.sh;
#   2. a Kimi-K2.5 rank (61 layers projected from 4 / 12-layer cuts) and Moonlight at batch 1,
#      two processes (RUNS), each timing the variants that earlier sessions left within their
#      spread beside a no-change control, twice each: the router GEMV's first weights before its
#      PDL wait (router_preload; session 13: Kimi -0.9 / -0.2 / -1.7%, "within the control's
#      2%"), the MLA decode without L2 prefetch and with one S group (mla_pf0, mla_sgroups1;
#      this session's first H100 read Moonlight -2.1 / -2.3% with them, against a default timed
#      first), and the norm preload off (no_norm_preload). (Call 4 ran k46 with router_preload
#      first in the list, the preload off by default then; main has it on, and the list here
#      starts with its A/B, no_router_preload, with PREBUILT=k48.)
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
V1=no_router_preload,mla_pf0,mla_sgroups1,no_norm_preload,defaults
V=${VARIANTS:-$V1,$V1}
for i in $(seq 1 "${RUNS:-2}"); do
  OUT=$OUT/rank-$i STRATA_CARRY=$PWD/.devcarry/fxs PREBUILT=$PREBUILT STAGES="kimi moonlight" \
    KIMI_CUTS="4 12" KIMI_BATCHES=1 KIMI_VARIANTS=$V MOONLIGHT_VARIANTS=$V \
    bash bench/cuda/session10_check.sh 2>&1 | grep -E "^kimi 61|^decode|^variant" | cut -c1-110
  echo "[run $i @$(( $(date +%s) - t0 )) s]"
done
echo "[session44b_check total @$(( $(date +%s) - t0 )) s]"
