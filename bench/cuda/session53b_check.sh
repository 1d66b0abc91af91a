#!/bin/bash
# Session 53's second call (kit s53, as session53_check.sh). On an H200 first: the rows owed since
# session 43 (prebuilt_h200_rows), leaving ~100 s. Then Moonlight batch 1's kernel listing
# (--timeline 2) with the defaults and with mla_query_proj: where the proj form's launch spends
# its ~13.7 µs a layer (H100 call 1: the q_proj ‖ kv_a pair, the cache rows and W_UK took 13.2
# µs of increments, kv_a alone and the proj launch 16.5). BUDGET_S: the call's limit (575 s).
set -u
STRATA_CARRY=${STRATA_CARRY:-$PWD/.devcarry/fxs} source bench/cuda/device_env.sh
source bench/cuda/prebuilt.sh
PREBUILT=${PREBUILT:-s53}
prebuilt_begin "$PREBUILT" "$C" || exit 1
prebuilt_h200_rows 100
if [ "$(prebuilt_left)" -gt 50 ]; then
  timeout 60 "$BIN/strata_bench_kit" rank_step_bench \
    --config "$C/shared/configs/moonlight-16b-a3b/config.json" --batches 1 --context 768 \
    --prefill 0 --reps 40 --variants mla_query_proj --timeline 2 --timeline-variants mla_query_proj \
    >"$OUT/moonlight_tl2.log" 2>&1
  echo "moonlight listing: exit $?"
  grep -E "^decode|^variant|^timeline" "$OUT/moonlight_tl2.log" | cut -c1-200
fi
prebuilt_end session53b_check
