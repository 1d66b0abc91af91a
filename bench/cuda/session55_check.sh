#!/bin/bash
# Session 55: every row bench/RESULTS.md judges on an H200, with main's kit from the s53c pack
# (packed at 19670f7: main's product code; session53c_check.sh says how to repack). Session 54's
# call took 56 s for session10_check's stages alone, so this call adds the kernel rows owed on an
# H200 too: one Llama-3.1-8B W4A16 token's 128 GEMVs (`int4_linear_bench --what ceilings,token`;
# H200 owed since session 5), one Kimi-K2.5 rank's INT4 experts at T = 1 / 2 / 4 / 8 / 32 / 128
# (`moe_bench --what backend`; H200 since session 31), then the Kimi rank's cuts again (a second
# and third process: its target is ≤ 5 ms on every H200). On another GPU they run as that GPU's
# readings. Carry .devcarry/s53c and .devcarry/bench, the tree without
# tests/fixtures/hidden_states/*.safetensors. BUDGET_S: the call's limit (default 575).
set -u
STRATA_CARRY=${STRATA_CARRY:-$PWD/.devcarry/bench} source bench/cuda/device_env.sh
source bench/cuda/prebuilt.sh
PREBUILT=${PREBUILT:-s53c}
prebuilt_begin "$PREBUILT" "$C" || exit 1
ROWS_ANY_GPU=1 prebuilt_h200_rows 15

if [ "$(prebuilt_left)" -gt 70 ]; then
  timeout 60 "$BIN/strata_bench_kit" int4_linear_bench --what ceilings,token >"$OUT/token.log" 2>&1
  echo "token: exit $?"
  grep -E "^(summary  copy|ceiling|token)" "$OUT/token.log" | cut -c1-260
  echo "[token @$(( $(date +%s) - t0 )) s]"
fi
if [ "$(prebuilt_left)" -gt 100 ]; then
  timeout 90 "$BIN/strata_bench_kit" moe_bench --what backend --backend-configs kimi \
    --tokens 1,2,4,8,32,128 >"$OUT/experts.log" 2>&1
  echo "experts: exit $?"
  grep -E "^(ceiling|backend|summary)" "$OUT/experts.log" | cut -c1-260
  echo "[experts @$(( $(date +%s) - t0 )) s]"
fi
for i in 2 3; do
  [ "$(prebuilt_left)" -gt 60 ] || break
  ROW_STAGES=kimi ROWS_ANY_GPU=1 OUT=$OUT/kimi_$i prebuilt_h200_rows 15 | grep -E "^kimi 61|rows @"
done
prebuilt_end session55_check
