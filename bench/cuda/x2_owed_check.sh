#!/bin/bash
# Issue 23's prepared cluster form of the MoE prefill gate_up (x shared by a plan tile's two CTAs,
# bench/results/2026-12-06-session36-prepared-gate-up-x2.patch) timed against main's kernel in one
# binary (STRATA_PIPE_X2 0 / 1, alternated: the GPU's power state moves a process's timings by
# several %), then on an H200 the rows session 36 owes (Kimi rank, Moonlight batch 1, MLA
# acceptance). Binaries packed on the CPU machine, no build here:
#   here:   bash bench/cuda/prebuilt.sh pack x2o \
#             bench/results/2026-12-06-session36-prepared-gate-up-x2.patch:strata_bench_moe_bench \
#             strata_bench_mla_bench strata_bench_rank_step_bench
#   device: (carry .devcarry/x2o and .devcarry/cfg) bash bench/cuda/x2_owed_check.sh
# x2's "regimes agree NMSE" (decode against prefill on the same routed rows) is its first
# correctness check; the parity suites (PREBUILT=x2ab: the pack of the patched moe_bench and
# strata_parity_test) must pass before it could go in. OWED=0 skips the owed rows.
set -u
OUT=${OUT:-/tmp/strata_out}
mkdir -p "$OUT"
t0=$(date +%s)
PREBUILT=${PREBUILT:-x2o}
source bench/cuda/prebuilt.sh unpack "$PREBUILT" || exit 1
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader)
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
X2=$PB/2026-12-06-session36-prepared-gate-up-x2_strata_bench_moe_bench
run() {  # LABEL STRATA_PIPE_X2
  STRATA_PIPE_X2=$2 timeout 100 "$X2" --what kernels --configs dsv3,kimi,moonlight \
    --tokens 8192 --sweep 0 >"$OUT/k_$1.log" 2>&1
  local rc=$?
  echo "[$1 @$(( $(date +%s) - t0 )) s] exit $rc $(grep -E '^ceiling +cuBLAS' "$OUT/k_$1.log" | cut -c10-60)"
  grep -oE "^moe +[a-z0-9-]+ +T=8192 .*regimes agree NMSE \S+" "$OUT/k_$1.log" | sed -E 's/ \|.*\|/:/'
  grep -E "experts prefill" "$OUT/k_$1.log" | sed -E 's/ +/ /g; s/[0-9]+ GB\/s = [0-9.]+% of copy //' |
    cut -c1-200
}
run main 0
run x2 1
run main2 0
run x2_again 1
# The parity suites of the MoE GEMMs with the cluster form on (where the pack holds the binary).
PAR=$PB/2026-12-06-session36-prepared-gate-up-x2_strata_parity_test
if [ -x "$PAR" ]; then
  STRATA_PIPE_X2=1 timeout 240 "$PAR" --gtest_filter='MoeParity.*:MoeBackend.*' \
    >"$OUT/parity_x2.log" 2>&1
  echo "parity (STRATA_PIPE_X2=1): exit $?"
  grep -E "^\[  (PASSED|FAILED) |^\[  FAILED" "$OUT/parity_x2.log" | head -20
fi
if [ "${OWED:-1}" = 1 ] && [[ $gpu == *H200* ]] && [ -x "$PB/strata_bench_rank_step_bench" ]; then
  STRATA_CARRY=$PWD/.devcarry/cfg PREBUILT=$PREBUILT STAGES="kimi moonlight mla" KIMI_CUTS="4 12" \
    KIMI_BATCHES=1 KIMI_VARIANTS=uv_oproj,segments64 MOONLIGHT_VARIANTS=uv_oproj,segments64 \
    MLA_WHAT=ceilings,acceptance bash bench/cuda/session10_check.sh
fi
echo "total: $(( $(date +%s) - t0 )) s"
