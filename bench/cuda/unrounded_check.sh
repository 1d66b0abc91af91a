#!/bin/bash
# The INT4 experts' register-GEMV gate_up unrounded (CudaTunables::moe_int4_gate_up_round; session
# 41 ran it with the flat down's unrounded form too, since dropped: bench/results/2026-12-06-
# session41-flat-down-unrounded.patch): the MoE parity suites against the CPU twin, then one
# Kimi-K2.5 rank's experts through the backend at 1 / 8 / 32 / 128 tokens with the variants beside
# the defaults in one process (alternating), twice. From binaries built and packed on the CPU
# machine (no build here):
#   here:   bash bench/cuda/prebuilt.sh pack pt41 strata_parity_test strata_bench_moe_bench
#   device: (carry .devcarry/pt41 and .devcarry/cfg)  bash bench/cuda/unrounded_check.sh
# PARITY_FILTER overrides the suites; MOE_DECODE_VARIANTS the forms timed.
set -u
OUT=${OUT:-/tmp/strata_out}
mkdir -p "$OUT"
t0=$(date +%s)
source bench/cuda/prebuilt.sh unpack "${PREBUILT:-pt41}" || exit 1
prebuilt_link_shared "$PWD/.devcarry/cfg"  # moe_bench --what backend reads shared/configs
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
L=$OUT BIN=$PB
STRATA_CARRY=$PWD/.devcarry/cfg source bench/cuda/device_env.sh  # dev_parity
dev_parity moe "${PARITY_FILTER:-MoeBackend.*:Int4Parity.GemvReg*}" 300
grep -E "^gate_up round .* T (17|32|64):" "$OUT/parity_moe.log" | cut -c1-160 | head -24
for i in 1 2; do
  timeout 150 "$PB/strata_bench_moe_bench" --what backend --backend-configs kimi \
    --tokens 1,8,32,128 \
    --variants "${MOE_DECODE_VARIANTS:-moe_gu_unrounded}" \
    >"$OUT/moe_decode_$i.log" 2>&1
  echo "[moe decode $i @$(( $(date +%s) - t0 )) s] exit $?"
  grep -E "^(backend|variant) +kimi" "$OUT/moe_decode_$i.log" | sed -E 's/ \| router.*//' | cut -c1-170
done
echo "total: $(( $(date +%s) - t0 )) s"
