#!/bin/bash
# Session 50's H200 call: session 48's rows (session48f_check.sh: Llama-3.1-8B W4A16 batch 1 with
# its decode variants, the Kimi-K2.5 rank's 4- and 12-layer cuts and Moonlight at batch 1, issue
# 22's MLA rows) on an H200, bounded to the call. On any other GPU (those rows' H100 readings are
# recent: sessions 48-49) the W4A16 GEMV's fixed cost a launch and streaming rate on today's main
# instead (int4_linear_bench --what ceilings,scan,token; session 32 read them last).
# Carry .devcarry/llfx (debs + shared/configs); the tree without the hidden-state fixtures.
set -u
OUT=${OUT:-/tmp/strata_out}
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "gpu: $gpu"
if [[ $gpu != *H200* ]]; then
  STRATA_CARRY=$PWD/.devcarry/llfx source bench/cuda/device_env.sh
  dev_begin strata_bench_kit
  timeout 400 ./build-dev/strata_bench_kit int4_linear_bench --what ceilings,scan,token \
    >"$OUT/int4_scan.log" 2>&1
  grep -E -i "copy|GEMM|fixed|line|token|round" "$OUT/int4_scan.log" | cut -c1-200 | head -60
  exit 0
fi
STRATA_CARRY=$PWD/.devcarry/llfx timeout 560 bash bench/cuda/session48f_check.sh
