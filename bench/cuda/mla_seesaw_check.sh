#!/bin/bash
# Issue 22's prepared seesaw forms of the 128-head MLA decode (bench/results/
# 2026-12-06-session37-mla-seesaw.patch, STRATA_MLA_SEESAW=1: the chunks' S alternate between
# the two warpgroups; 2: each warpgroup also reloads its own column groups) against the pipe
# kernel in one binary, alternated, then their parity suites. Binaries packed on the CPU machine,
# no build here:
#   here:   S=bench/results/2026-12-06-session37-mla-seesaw.patch
#           bash bench/cuda/prebuilt.sh pack s37c $S:strata_bench_mla_bench $S:strata_parity_test
#   device: (carry .devcarry/s37c) PREBUILT=s37c bash bench/cuda/mla_seesaw_check.sh
# (Session 37's call 3 ran an earlier form that hung: both directions of its P hand-off on one
# named barrier; bench/cuda/mla_sync_model.py models the fixed one.)
# Verdict (session 38, bench/results/2026-12-06-session38.md): both forms pass MlaAttention.* and are
# slower (+30% / +17%); dropped. The patch applies to b2cb83f (the pipe kernel has since gained
# the row-tile pairs), so rebuild the pack from that commit to run this again.
set -u
OUT=${OUT:-/tmp/strata_out}
mkdir -p "$OUT"
t0=$(date +%s)
source bench/cuda/prebuilt.sh unpack "${PREBUILT:-s37c}" >/dev/null || exit 1
TAG=2026-12-06-session37-mla-seesaw
MLA=$PB/${TAG}_strata_bench_mla_bench
PAR=$PB/${TAG}_strata_parity_test
n=0
hung=" "
for f in ${FORMS:-0 1 2 0 1 2}; do
  [[ $hung == *" $f "* ]] && continue
  STRATA_MLA_SEESAW=$f timeout 60 "$MLA" --what ceilings,acceptance >"$OUT/mla_s${f}_$n.log" 2>&1
  rc=$?
  echo "[mla seesaw=$f @$(( $(date +%s) - t0 )) s] exit $rc"
  [ $rc != 0 ] && hung="$hung$f "  # a hung form costs 60 s a run: no more of it
  grep -E "^ceiling|^mla" "$OUT/mla_s${f}_$n.log" | sed 's/ of latent rows//' | cut -c1-200
  n=$((n + 1))
done
for f in 1 2; do
  [[ $hung == *" $f "* ]] && { echo "parity $f skipped: the form failed"; continue; }
  STRATA_MLA_SEESAW=$f timeout 200 "$PAR" --gtest_filter='MlaAttention.*' >"$OUT/parity_seesaw$f.log" 2>&1
  echo "parity (STRATA_MLA_SEESAW=$f): exit $?"
  grep -E "^\[  (PASSED|FAILED) |^\[  FAILED" "$OUT/parity_seesaw$f.log" | head -20
  echo "wgmma-pipe cases: $(grep -c "wgmma-pipe" "$OUT/parity_seesaw$f.log")"
done
echo "total: $(( $(date +%s) - t0 )) s"
