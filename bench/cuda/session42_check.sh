#!/bin/bash
# Session 42's one call (carry .devcarry/k42 — strata_parity_test and strata_bench_kit — and
# .devcarry/fxs: 61.8 MB with the tracked tree): the INT4 experts' gate_up unrounded by default
# through the MoE, INT4 and DeepSeek fixture suites, the experts A/B (unrounded_check.sh), then the
# readings main owes (owed_h200_check.sh) with the Kimi-K2.5 rank's step A/B of both knobs.
set -u
OUT=${OUT:-/tmp/strata_out}
mkdir -p "$OUT"
t0=$(date +%s)
PREBUILT=k42 MOE_DECODE_RUNS=1 PARITY_TIMEOUT=240 bash bench/cuda/unrounded_check.sh
echo "[unrounded_check done @$(( $(date +%s) - t0 )) s]"
PREBUILT=k42 CARRY=$PWD/.devcarry/fxs MLA_RUNS=${MLA_RUNS:-2} KIMI_BATCHES=1,32,128 \
  KIMI_VARIANTS=${KIMI_VARIANTS:-moe_gu_rounded,moe_split_unrounded} MOE_RUNS=1 \
  bash bench/cuda/owed_h200_check.sh
echo "[session42_check total @$(( $(date +%s) - t0 )) s]"
