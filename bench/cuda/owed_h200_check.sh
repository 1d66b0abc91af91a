#!/bin/bash
# The H200 readings main owes (bench/RESULTS.md), from binaries built and packed on the CPU machine
# (no build here): issue 22's MLA rows (128 heads with the row-tile pairs: met on H100s, H200
# owed; 16 heads on the line), issue 23's MoE prefill at 8,192 (its verdict moves with the same
# run's cuBLAS ceiling), issue 24's Kimi-K2.5 rank and Moonlight at batch 1. Each row twice or
# three times: one process's GPU clock state moves its timings by several %.
#   here:   bash bench/cuda/prebuilt.sh pack k42 strata_bench_kit   (~12 MB: the benchmarks as
#             one program; strata_parity_test beside it for session42_check.sh's parity)
#           bash bench/cuda/make_carry.sh bench && cp -r .devcarry/bench .devcarry/cfg
#   device: (carry .devcarry/k42 and .devcarry/cfg)  bash bench/cuda/owed_h200_check.sh
#   (CARRY names another carried folder holding shared/configs, e.g. .devcarry/fxs)
#   (MLA_RUNS, STEP_STAGES, MOE_DECODE_VARIANTS, MOE_RUNS below)
# On another GPU it runs all the same and says so: the rows' targets are the H200's.
set -u
OUT=${OUT:-/tmp/strata_out}
mkdir -p "$OUT"
t0=$(date +%s)
PREBUILT=${PREBUILT:-k42}
CARRY=${CARRY:-$PWD/.devcarry/cfg}
source bench/cuda/prebuilt.sh unpack "$PREBUILT" || exit 1
prebuilt_link_shared "$CARRY"  # moe_bench --what backend reads shared/configs
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader)
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
[[ $gpu == *H200* ]] || echo "not an H200 ($gpu): these readings are not the rows' verdicts"
# 1. MLA: the copy and GEMM ceilings of the process, then issue 22's rows (MLA_RUNS processes).
for i in $(seq 1 "${MLA_RUNS:-3}"); do
  timeout 90 "$PB/strata_bench_mla_bench" --what ceilings,acceptance >"$OUT/mla_$i.log" 2>&1
  echo "[mla $i @$(( $(date +%s) - t0 )) s] exit $?"
  grep -E "^ceiling|^mla" "$OUT/mla_$i.log" | sed 's/ of latent rows//' | cut -c1-220
done
# 2. Kimi-K2.5 rank (4- and 12-layer cuts projected to 61) and Moonlight at batch 1 (STEP_STAGES;
# add "llama" with LLAMA_CONFIG=llama-3.1-8b-w4a16 for the W4A16 row), each stage's *_VARIANTS as
# session10_check.sh takes them (e.g. KIMI_VARIANTS=mla_pf0: an A/B in the same process).
STRATA_CARRY=$CARRY PREBUILT=$PREBUILT STAGES="${STEP_STAGES:-kimi moonlight}" \
  KIMI_CUTS="4 12" KIMI_BATCHES=${KIMI_BATCHES:-1} bash bench/cuda/session10_check.sh
# 2b. With MOE_DECODE_VARIANTS: one Kimi-K2.5 rank's INT4 experts through the backend at 1 / 8 /
# 32 / 128 tokens, the defaults and those variants in one process, twice.
if [ -n "${MOE_DECODE_VARIANTS:-}" ]; then
  for i in 1 2; do
    timeout 120 "$PB/strata_bench_moe_bench" --what backend --backend-configs kimi \
      --tokens 1,8,32,128 --variants "$MOE_DECODE_VARIANTS" >"$OUT/moe_decode_$i.log" 2>&1
    echo "[moe decode $i @$(( $(date +%s) - t0 )) s] exit $?"
    grep -v "^\s*$" "$OUT/moe_decode_$i.log" | tail -30 | cut -c1-200
  done
fi
# 3. The MoE experts' GEMMs at 8,192 tokens against the process's cuBLAS rate (MOE_RUNS processes).
source bench/cuda/moe_prefill_ab.sh
for i in $(seq 1 "${MOE_RUNS:-2}"); do moe_prefill_ab "main_$i" "$PB/strata_bench_moe_bench"; done
echo "total: $(( $(date +%s) - t0 )) s"
