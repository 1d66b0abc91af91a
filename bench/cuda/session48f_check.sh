#!/bin/bash
# Session 48's H200 call: the RESULTS rows the new decode defaults move (decode_early_kv,
# decode_rope_fusion_max_seqs 1, the norm prologues' weights held), built on the GPU machine by
# session10_check.sh; carry .devcarry/bench. Llama-3.1-8B W4A16 at batch 1 with the two decode
# variants beside the defaults, the Kimi-K2.5 rank (4- and 12-layer cuts) and Moonlight at batch
# 1, issue 22's MLA rows; the rank stages twice (two processes), then Llama-3.1-8B bf16.
# STRATA_CARRY: another carried folder with debs and shared/configs (e.g. .devcarry/llfx).
set -u
OUT=${OUT:-/tmp/strata_out}
mkdir -p "$OUT"
t0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
export STRATA_CARRY=${STRATA_CARRY:-$PWD/.devcarry/bench} KIMI_CUTS="4 12" KIMI_BATCHES=1
run10() {  # TAG STAGES LLAMA_CONFIG
  OUT=$OUT/$1 STAGES=$2 LLAMA_CONFIG=$3 LLAMA_VARIANTS=no_decode_rope_fusion,no_decode_early_kv \
    bash bench/cuda/session10_check.sh 2>&1 | grep -vE "NMSE|^\s*$" | cut -c1-220
  echo "[$1 @$(( $(date +%s) - t0 )) s]"
}
run10 a "llama kimi moonlight mla" llama-3.1-8b-w4a16
run10 b "llama kimi moonlight" llama-3.1-8b-w4a16
run10 c "llama" llama-3.1-8b
echo "[session48f_check total @$(( $(date +%s) - t0 )) s]"
