#!/bin/bash
# The H200 readings main owes (bench/RESULTS.md), from binaries built and packed on the CPU machine
# (no build here): issue 22's MLA rows (128 heads with the row-tile pairs: met on H100s, H200
# owed; 16 heads on the line), issue 23's MoE prefill at 8,192 (its verdict moves with the same
# run's cuBLAS ceiling), issue 24's Kimi-K2.5 rank and Moonlight at batch 1. Each row twice or
# three times: one process's GPU clock state moves its timings by several %.
#   here:   bash bench/cuda/prebuilt.sh pack h40 strata_bench_mla_bench \
#             strata_bench_rank_step_bench strata_bench_moe_bench   (~39 MB; done at 025f610, the
#             MLA decode's 2026-12-06 defaults; h39: 7181c0e)
#   device: (carry .devcarry/h40 and .devcarry/cfg)  bash bench/cuda/owed_h200_check.sh
# On another GPU it runs all the same and says so: the rows' targets are the H200's.
set -u
OUT=${OUT:-/tmp/strata_out}
mkdir -p "$OUT"
t0=$(date +%s)
PREBUILT=${PREBUILT:-h40}
source bench/cuda/prebuilt.sh unpack "$PREBUILT" || exit 1
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader)
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
[[ $gpu == *H200* ]] || echo "not an H200 ($gpu): these readings are not the rows' verdicts"
# 1. MLA: the copy and GEMM ceilings of the process, then issue 22's rows.
for i in 1 2 3; do
  timeout 90 "$PB/strata_bench_mla_bench" --what ceilings,acceptance >"$OUT/mla_$i.log" 2>&1
  echo "[mla $i @$(( $(date +%s) - t0 )) s] exit $?"
  grep -E "^ceiling|^mla" "$OUT/mla_$i.log" | sed 's/ of latent rows//' | cut -c1-220
done
# 2. The MoE experts' GEMMs at 8,192 tokens against the process's cuBLAS rate.
source bench/cuda/moe_prefill_ab.sh
for i in 1 2; do moe_prefill_ab "main_$i" "$PB/strata_bench_moe_bench"; done
# 3. Kimi-K2.5 rank (4- and 12-layer cuts projected to 61) and Moonlight at batch 1.
STRATA_CARRY=$PWD/.devcarry/cfg PREBUILT=$PREBUILT STAGES="kimi moonlight" KIMI_CUTS="4 12" \
  KIMI_BATCHES=1 bash bench/cuda/session10_check.sh
echo "total: $(( $(date +%s) - t0 )) s"
