#!/bin/bash
# Session 42's second call (carry .devcarry/k42b — strata_parity_test and strata_bench_kit — and
# .devcarry/fxs): the W4A16 register GEMV's x by one bulk copy (CudaTunables::int4_gemv_x_tma,
# off by default) through the INT4 and MoE suites (the experts' register GEMV shares its x
# staging), one 8B token's 128 W4A16 GEMVs with it and without (int4_linear_bench --what token),
# then the readings main owes with the Llama-3.1-8B W4A16 step's A/B (owed_h200_check.sh). The
# third call, the knob on by default: PREBUILT=k42c LLAMA_VARIANTS=no_int4_x_tma,int4_x_tma8.
set -u
OUT=${OUT:-/tmp/strata_out}
mkdir -p "$OUT"
t0=$(date +%s)
source bench/cuda/prebuilt.sh unpack "${PREBUILT:-k42b}" || exit 1
prebuilt_link_shared "$PWD/.devcarry/fxs"
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
L=$OUT BIN=$PB
STRATA_CARRY=$PWD/.devcarry/fxs source bench/cuda/device_env.sh  # dev_parity
dev_parity int4 "${PARITY_FILTER:-Int4Parity.*:MoeBackend.*:MoeParity.*:*QuantModel*:*MoeModel*-*HouseMla*:*house_mla*}" 240
grep -E "^int4 reg (knobs=(13|14|15)|8B)" "$OUT/parity_int4.log" | head -12
for i in 1 2; do
  timeout 120 "$PB/strata_bench_int4_linear_bench" --what ceilings,token >"$OUT/token_$i.log" 2>&1
  echo "[token $i @$(( $(date +%s) - t0 )) s] exit $?"
  grep -E "^ceiling|^token" "$OUT/token_$i.log" | cut -c1-200
done
export LLAMA_CONFIG=llama-3.1-8b-w4a16 LLAMA_VARIANTS=${LLAMA_VARIANTS:-int4_x_tma,int4_x_tma_all}
PREBUILT=${PREBUILT:-k42b} CARRY=$PWD/.devcarry/fxs MLA_RUNS=${MLA_RUNS:-2} \
  STEP_STAGES="kimi moonlight llama" KIMI_BATCHES=1,32,128 KIMI_VARIANTS=moe_gu_rounded \
  MOE_RUNS=1 bash bench/cuda/owed_h200_check.sh
echo "[session42b_check total @$(( $(date +%s) - t0 )) s]"
