#!/bin/bash
# The MLA decode defaults that sessions 40-41 adopted on H100 evidence (the L2 prefetch one chunk
# ahead over bf16 rows, two S groups at 16 rows), on an H200: session 43's H200 read the decode
# rows at 74 / 79% of copy (16 / 8 heads) where session 37's H200 read 82.7 / 88.2%. From a
# prebuilt pack (carry .devcarry/PREBUILT, default k48 — strata_parity_test and strata_bench_kit
# at main, session 44 — and .devcarry/fxs; session 43 packed k44 for it):
#   1. mla_bench, two processes: the acceptance rows as built and with --l2-prefetch 0, then
#      --what sgroups (one S group against two, bf16 and fp8_flashmla, L2 prefetch 1 / 2 / 4);
#   2. Moonlight and a Kimi-K2.5 rank at batch 1 with variants mla_pf0, mla_sgroups1 beside the
#      defaults set explicitly, each twice (rank_step_bench, A/B in one process).
# On another GPU it runs all the same and says so.
set -u
OUT=${OUT:-/tmp/strata_out}
mkdir -p "$OUT"
t0=$(date +%s)
PREBUILT=${PREBUILT:-k48}
source bench/cuda/prebuilt.sh unpack "$PREBUILT" || exit 1
CARRY=${CARRY:-$PWD/.devcarry/fxs}  # shared/configs (and fixtures) carried
prebuilt_link_shared "$CARRY"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader)
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
[[ $gpu == *H200* ]] || echo "not an H200 ($gpu)"
for i in 1 2; do
  timeout 60 "$PB/strata_bench_mla_bench" --what ceilings,acceptance >"$OUT/mla_acc_$i.log" 2>&1
  timeout 60 "$PB/strata_bench_mla_bench" --what acceptance --l2-prefetch 0 >"$OUT/mla_pf0_$i.log" 2>&1
  timeout 90 "$PB/strata_bench_mla_bench" --what sgroups >"$OUT/mla_sg_$i.log" 2>&1
  echo "[mla $i @$(( $(date +%s) - t0 )) s]"
  grep -E "^ceiling" "$OUT/mla_acc_$i.log" | cut -c1-120
  for f in acc pf0; do
    grep -E "^mla +accept .*(16|8) heads" "$OUT/mla_${f}_$i.log" | sed "s/^/$f /" | cut -c1-200
  done
  grep -E "^mla " "$OUT/mla_sg_$i.log" | cut -c1-175 | head -24
done
# Each variant twice, beside the defaults set explicitly (mla_pf1, mla_sgroups2): the first graph
# timing of a process reads slower at times (H100, 2026-12-06 session 44: Moonlight default 2.771,
# both variants ~2.71 ms after it).
AB=mla_pf0,mla_sgroups1,mla_pf1,mla_sgroups2,mla_pf0,mla_sgroups1,mla_pf1,mla_sgroups2
STRATA_CARRY=$CARRY PREBUILT=$PREBUILT STAGES="kimi moonlight" KIMI_CUTS="4 12" \
  KIMI_BATCHES=1 KIMI_VARIANTS=$AB MOONLIGHT_VARIANTS=$AB \
  bash bench/cuda/session10_check.sh
echo "[mla_h200_ab total @$(( $(date +%s) - t0 )) s]"
