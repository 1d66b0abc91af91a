#!/bin/bash
# Session 54: the rows bench/RESULTS.md judges on an H200 and has owed since session 43
# (Llama-3.1-8B W4A16 batch 1, the Kimi-K2.5 rank at batch 1, Moonlight batch 1, the MLA
# acceptance; ROW_STAGES orders them), with main's kit from the s53c pack (packed at 19670f7:
# main's product code; session53c_check.sh says how to repack). On another GPU the same rows
# run as that GPU's readings (ROWS_ANY_GPU). Carry .devcarry/s53c and .devcarry/bench, the tree
# without tests/fixtures/hidden_states/*.safetensors. BUDGET_S: the call's limit (575 s), less
# what the start may take where the session's device time is short.
set -u
STRATA_CARRY=${STRATA_CARRY:-$PWD/.devcarry/bench} source bench/cuda/device_env.sh
source bench/cuda/prebuilt.sh
PREBUILT=${PREBUILT:-s53c}
prebuilt_begin "$PREBUILT" "$C" || exit 1
ROWS_ANY_GPU=1 prebuilt_h200_rows 15
prebuilt_end session54_check
