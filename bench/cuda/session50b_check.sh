#!/bin/bash
# Session 50's H200 call: session 48's rows (session48f_check.sh: Llama-3.1-8B W4A16 batch 1 with
# its decode variants, the Kimi-K2.5 rank's 4- and 12-layer cuts and Moonlight at batch 1, issue
# 22's MLA rows) on an H200, bounded to the call. On any other GPU it stops at once: those rows'
# H100 readings are recent (sessions 48-49) and the targets are an H200's.
# Carry .devcarry/llfx (debs + shared/configs); the tree without the hidden-state fixtures.
set -u
OUT=${OUT:-/tmp/strata_out}
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "gpu: $gpu"
[[ $gpu == *H200* ]] || { echo "not an H200: nothing run"; exit 0; }
STRATA_CARRY=$PWD/.devcarry/llfx timeout 560 bash bench/cuda/session48f_check.sh
