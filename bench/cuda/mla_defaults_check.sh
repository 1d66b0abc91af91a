#!/bin/bash
# The MLA decode kernel's new defaults (2026-12-06: two S groups by rows at 16 rows, L2 prefetch one
# chunk ahead over bf16 rows): the MLA parity suites and the DeepSeek-architecture fixtures
# through them, then issue 22's rows and the batch-1 steps. Binaries built and packed on the CPU
# machine (no build here):
#   here:   bash bench/cuda/prebuilt.sh pack md strata_parity_test strata_bench_mla_bench
#             (+ strata_bench_rank_step_bench for the steps, carrying .devcarry/cfg: with the tree and
#             the fixtures the three pass the 64 MiB carry)
#   device: (carry .devcarry/md, .devcarry/fxd)  bash bench/cuda/mla_defaults_check.sh
set -u
OUT=${OUT:-/tmp/strata_out}
mkdir -p "$OUT"
t0=$(date +%s)
source bench/cuda/prebuilt.sh unpack md || exit 1
prebuilt_link_shared "$PWD/.devcarry/fxd"
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
F='MlaAttention.*:MlaBackend.*:MlaDcp.*:Fixtures/MlaModel.*/deepseek*:MlaModelLong.*'
timeout 400 "$PB/strata_parity_test" --gtest_filter="${PARITY_FILTER:-$F}" >"$OUT/parity.log" 2>&1
rc=$?
echo "[parity @$(( $(date +%s) - t0 )) s] exit $rc"
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure|tests ran" "$OUT/parity.log" | cut -c1-200 | head -20
[ $rc -eq 0 ] || { echo "parity failed: no benchmark"; exit 1; }
for i in 1 2; do
  timeout 120 "$PB/strata_bench_mla_bench" --what ceilings,acceptance >"$OUT/mla_$i.log" 2>&1
  echo "[mla $i @$(( $(date +%s) - t0 )) s] exit $?"
  grep -E "^ceiling|^mla|^pairs|^sgroups" "$OUT/mla_$i.log" | sed 's/ of latent rows//' | cut -c1-210
done
[ -x "$PB/strata_bench_rank_step_bench" ] &&
  STRATA_CARRY=$PWD/.devcarry/cfg PREBUILT=md STAGES="kimi moonlight" KIMI_CUTS="4 12" KIMI_BATCHES=1 \
  KIMI_VARIANTS=segments64 MOONLIGHT_VARIANTS=segments64 bash bench/cuda/session10_check.sh
echo "total: $(( $(date +%s) - t0 )) s"
