#!/bin/bash
# Session 43's call (carry .devcarry/k42d — strata_parity_test and strata_bench_kit built with
# moe_int4_split_round = -1, the split gate_up unrounded only where its weights come by TMA — and
# .devcarry/fxs): that form through the MoE, INT4 and DeepSeek fixture suites, one Kimi-K2.5
# rank's experts at 1-128 tokens against the rounded and always-unrounded forms (three
# processes), then the readings main owes (owed_h200_check.sh) with the Kimi rank's step at
# batch 1 / 2 against the rounded form and the Llama-3.1-8B W4A16 step.
set -u
OUT=${OUT:-/tmp/strata_out}
mkdir -p "$OUT"
t0=$(date +%s)
export PREBUILT=${PREBUILT:-k42d}
MOE_DECODE_RUNS=${MOE_DECODE_RUNS:-3} \
  MOE_DECODE_VARIANTS=${MOE_DECODE_VARIANTS:-moe_split_rounded,moe_split_unrounded} \
  PARITY_FILTER='MoeBackend.*:MoeParity.*:Int4Parity.*:*MoeModel*:*QuantModel*-*HouseMla*:*house_mla*' \
  bash bench/cuda/unrounded_check.sh
echo "[unrounded_check done @$(( $(date +%s) - t0 )) s]"
LLAMA_CONFIG=llama-3.1-8b-w4a16 CARRY=$PWD/.devcarry/fxs MLA_RUNS=${MLA_RUNS:-2} \
  STEP_STAGES="kimi moonlight llama" KIMI_BATCHES=1,2 KIMI_VARIANTS=moe_split_rounded \
  MOE_RUNS=1 bash bench/cuda/owed_h200_check.sh
echo "[session43_check total @$(( $(date +%s) - t0 )) s]"
