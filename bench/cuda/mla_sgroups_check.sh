#!/bin/bash
# Issue 22's 16-head row (>= 85% of copy on an H200; the decode kernel reads 82.7-85.7% there):
# the decode kernel's 16-row blocks with two groups of S warps, by rows or (fp8 rows through the V
# tile) by dims (MlaPlanOptions::s_groups 2 / 3, CudaTunables::mla_s_groups), binaries built and
# packed on the CPU machine (no build here):
#   here:   bash bench/cuda/prebuilt.sh pack sg strata_parity_test strata_bench_mla_bench \
#             strata_bench_rank_step_bench
#   device: (carry .devcarry/sg, .devcarry/fxd and .devcarry/cfg)  bash bench/cuda/mla_sgroups_check.sh
# In order: the MLA parity suites (MlaAttention.DecodeSGroups: against the CPU twin and against one
# group, by rows bit for bit; the decode kernel's other suites); only if they pass, `mla_bench
# --what ceilings,sgroups,acceptance` twice (one group against two, bf16 and fp8_flashmla, three
# alternating rounds, wait profiles; the product's rows), then Moonlight's step at batch 1 / 64 /
# 256 with variant mla_sgroups2 (batch 1 runs 8-row blocks: a control).
set -u
OUT=${OUT:-/tmp/strata_out}
mkdir -p "$OUT"
t0=$(date +%s)
PREBUILT=${PREBUILT:-sg}
source bench/cuda/prebuilt.sh unpack "$PREBUILT" || exit 1
prebuilt_link_shared "$PWD/.devcarry/fxd"
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
F='MlaAttention.DecodeSGroups:MlaAttention.Decode*:MlaBackend.*:MlaDcp.*'
timeout 300 "$PB/strata_parity_test" --gtest_filter="$F" >"$OUT/parity.log" 2>&1
rc=$?
echo "[parity @$(( $(date +%s) - t0 )) s] exit $rc"
grep -E "S groups|^\[  (PASSED|FAILED) |^\[  FAILED|Failure" "$OUT/parity.log" | cut -c1-200 | sort | uniq -c | sort -rn | head -30
[ $rc -eq 0 ] || { echo "parity failed: no benchmark"; exit 1; }
for i in 1 2; do
  timeout 150 "$PB/strata_bench_mla_bench" --what ceilings,sgroups,acceptance >"$OUT/mla_$i.log" 2>&1
  echo "[mla $i @$(( $(date +%s) - t0 )) s] exit $?"
  grep -E "^ceiling|^mla|^sgroups|^prof" "$OUT/mla_$i.log" | sed 's/ of latent rows//' | cut -c1-230
done
# (Only where the pack holds it: with the tree it may not fit the 64 MiB carry.)
[ -x "$PB/strata_bench_rank_step_bench" ] &&
timeout 200 "$PB/strata_bench_rank_step_bench" --config "$PWD/.devcarry/cfg/shared/configs/moonlight-16b-a3b/config.json" \
  --batches 1,64,256 --context 768 --prefill 0 --reps 50 --variants mla_sgroups2 >"$OUT/moonlight.log" 2>&1
echo "[moonlight @$(( $(date +%s) - t0 )) s] exit $?"
grep -E "^decode|^variant" "$OUT/moonlight.log" | cut -c1-220
echo "total: $(( $(date +%s) - t0 )) s"
