#!/bin/bash
# Issue 23's prepared cluster forms of the MoE prefill gate_up (bench/results/
# 2026-12-06-session37-gate-up-x2-x4.patch: STRATA_PIPE_X2=1 x shared by a plan tile's two CTAs,
# 2 also the weights shared by an expert's two plan tiles in clusters of 4) timed against main's
# kernel in one binary (alternated: the GPU's power state moves a process's timings by several
# %), their parity suites, then on an H200 the rows session 36 owes (Kimi rank, Moonlight batch
# 1, MLA acceptance). Binaries packed on the CPU machine, no build here (session 36's x2 pack:
# TAG=2026-12-06-session36-prepared-gate-up-x2 FORMS="0 1 0 1" PARITY_FORMS=1; the lagged form:
# TAG=2026-12-06-session37-gate-up-x2-lag FORMS="0 3 0 3" PARITY_FORMS=""):
#   here:   P=bench/results/2026-12-06-session37-gate-up-x2-x4.patch
#           bash bench/cuda/prebuilt.sh pack x4ab $P:strata_bench_moe_bench $P:strata_parity_test
#           (or x2o: $P:strata_bench_moe_bench strata_bench_mla_bench strata_bench_rank_step_bench)
#   device: (carry .devcarry/NAME, and .devcarry/cfg for the owed rows)
#           PREBUILT=NAME bash bench/cuda/x2_owed_check.sh
# A form's "regimes agree NMSE" (decode against prefill on the same routed rows) is its first
# correctness check; the parity suites must pass before it could go in. OWED=0 skips the owed
# rows. Verdict (session 37, bench/results/2026-12-06-session37.md): both forms pass the parity
# suites and make gate_up 22-71% slower; dropped.
set -u
OUT=${OUT:-/tmp/strata_out}
mkdir -p "$OUT"
t0=$(date +%s)
PREBUILT=${PREBUILT:-x2o}
source bench/cuda/prebuilt.sh unpack "$PREBUILT" || exit 1
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader)
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
# The A/B binaries: TAG (a patch's name) _strata_bench_moe_bench / _strata_parity_test.
TAG=${TAG:-2026-12-06-session37-gate-up-x2-x4}
X2=$PB/${TAG}_strata_bench_moe_bench
[ -x "$X2" ] || X2=$PB/2026-12-06-session36-prepared-gate-up-x2_strata_bench_moe_bench
PAR=$PB/${TAG}_strata_parity_test
[ -x "$PAR" ] || PAR=$PB/2026-12-06-session36-prepared-gate-up-x2_strata_parity_test
source bench/cuda/moe_prefill_ab.sh
run() {  # LABEL STRATA_PIPE_X2
  STRATA_PIPE_X2=$2 AB_TIMEOUT=100 moe_prefill_ab "$1" "$X2"
}
# The parity suites of the MoE GEMMs with a cluster form on (where the pack holds the binary).
parity() {  # STRATA_PIPE_X2
  [ -x "$PAR" ] || return 0
  STRATA_PIPE_X2=$1 timeout 240 "$PAR" --gtest_filter='MoeParity.*:MoeBackend.*' \
    >"$OUT/parity_x$1.log" 2>&1
  echo "parity (STRATA_PIPE_X2=$1): exit $?"
  grep -E "^\[  (PASSED|FAILED) |^\[  FAILED" "$OUT/parity_x$1.log" | head -20
}
# FORMS: STRATA_PIPE_X2 values in turn (0 main, 1 x shared in pairs, 2 also weights in fours).
n=0
hung=" "
for f in ${FORMS:-0 1 2 0 1 2}; do
  [[ $hung == *" $f "* ]] && { echo "form $f skipped: it timed out before"; continue; }
  run "f${f}_$n" "$f" || hung="$hung$f "  # timed out or crashed: a hang costs 100 s a run
  n=$((n + 1))
done
for f in ${PARITY_FORMS:-1 2}; do parity "$f"; done
if [ "${OWED:-1}" = 1 ] && [[ $gpu == *H200* ]] && [ -x "$PB/strata_bench_rank_step_bench" ]; then
  STRATA_CARRY=$PWD/.devcarry/cfg PREBUILT=$PREBUILT STAGES="kimi moonlight mla" KIMI_CUTS="4 12" \
    KIMI_BATCHES=1 KIMI_VARIANTS=uv_oproj,segments64 MOONLIGHT_VARIANTS=uv_oproj,segments64 \
    MLA_WHAT=ceilings,acceptance bash bench/cuda/session10_check.sh
fi
echo "total: $(( $(date +%s) - t0 )) s"
