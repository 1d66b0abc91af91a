#!/bin/bash
# The MLA decode kernel's L2 prefetch one chunk ahead (CudaTunables::mla_l2_prefetch 1) against
# none (the default since 2026-12-02, when distance 2 lost on every layout), and two S groups by
# rows (mla_s_groups 2), in the kernel and in the steps. Binaries built and packed on the CPU
# machine (no build here):
#   here:   bash bench/cuda/prebuilt.sh pack mp strata_bench_mla_bench strata_bench_rank_step_bench
#   device: (carry .devcarry/mp, .devcarry/cfg)  bash bench/cuda/mla_prefetch_check.sh
# In order: `mla_bench --what ceilings,acceptance` with --l2-prefetch 0 / 1 alternating, twice
# (issue 22's rows: bf16 and fp8_flashmla at 16, 8 and 128 heads); a Kimi-K2.5 rank's steps at
# KIMI_BATCHES (1,32,128) and Moonlight's at 1 / 64 / 256 with variants mla_pf1 (and Moonlight
# mla_sgroups2, and both).
set -u
OUT=${OUT:-/tmp/strata_out}
mkdir -p "$OUT"
t0=$(date +%s)
source bench/cuda/prebuilt.sh unpack mp || exit 1
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
for i in 1 2; do
  for pf in 0 1; do
    timeout 120 "$PB/strata_bench_mla_bench" --what ceilings,acceptance --l2-prefetch $pf \
      >"$OUT/mla_pf${pf}_$i.log" 2>&1
    echo "[mla pf$pf $i @$(( $(date +%s) - t0 )) s] exit $?"
    grep -E "^ceiling|^mla" "$OUT/mla_pf${pf}_$i.log" | sed 's/ of latent rows//; s/batch 64 x ctx  4096,    1 new, //' | cut -c1-170
  done
done
CFG=$PWD/.devcarry/cfg/shared/configs
timeout 240 "$PB/strata_bench_rank_step_bench" --config "$CFG/moonlight-16b-a3b/config.json" \
  --batches 1,64,256 --context 768 --prefill 0 --reps 50 --variants mla_pf1,mla_sgroups2 \
  >"$OUT/moonlight.log" 2>&1
echo "[moonlight @$(( $(date +%s) - t0 )) s] exit $?"
grep -E "^decode|^variant" "$OUT/moonlight.log" | cut -c1-200
STRATA_CARRY=$PWD/.devcarry/cfg PREBUILT=mp STAGES=kimi KIMI_CUTS="4 12" \
  KIMI_BATCHES=${KIMI_BATCHES:-1,32,128} KIMI_VARIANTS=mla_pf1 bash bench/cuda/session10_check.sh
echo "total: $(( $(date +%s) - t0 )) s"
