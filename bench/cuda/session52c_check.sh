#!/bin/bash
# Session 52's third call: main at the raw-x register GEMV (PREBUILT=s52b; carry .devcarry/s52b and
# .devcarry/fxs, the tree without tests/fixtures/hidden_states/*.safetensors; parity passed in the
# second call).
#   On an H200: the rows owed since session 43 (session10_check stages llama kimi moonlight mla:
#   Llama W4A16 batch 1, the Kimi rank's 4- and 12-layer cuts at batch 1 in one process and the
#   Kimi rank again in a second, Moonlight batch 1, the MLA acceptance rows).
#   Elsewhere (and after the rows if time is left): one Kimi-K2.5 rank's MoE layer through the
#   backend at 1 and 2 tokens, and a 4-layer Kimi cut's kernel listing at batch 1 (--timeline 2),
#   for the next target (INT4 experts at T = 1-2, the Kimi step).
set -u
STRATA_CARRY=${STRATA_CARRY:-$PWD/.devcarry/fxs} source bench/cuda/device_env.sh
source bench/cuda/prebuilt.sh
PREBUILT=${PREBUILT:-s52b}
prebuilt_begin "$PREBUILT" "$C" || exit 1
left() { echo $(( 575 - $(date +%s) + t0 )); }
rows() {  # TAG STAGES SECONDS
  STRATA_CARRY=$C OUT=$OUT/$1 STAGES=$2 PREBUILT=$PREBUILT LLAMA_CONFIG=llama-3.1-8b-w4a16 \
    KIMI_CUTS="4 12" KIMI_BATCHES=1 timeout "$3" bash bench/cuda/session10_check.sh 2>&1 |
    grep -vE "NMSE|^\s*$" | cut -c1-220
  echo "[$1 @$(( $(date +%s) - t0 )) s]"
}
if [[ $gpu == *H200* ]]; then
  rows a "llama kimi moonlight mla" $(( $(left) - 120 ))
  [ "$(left)" -lt 100 ] || rows b "kimi" $(( $(left) - 40 ))
fi
if [ "$(left)" -gt 60 ]; then
  timeout 60 "$BIN/strata_bench_kit" moe_bench --what backend --backend-configs kimi --tokens 1,2 \
    >"$OUT/moe_kimi.log" 2>&1
  grep -vE "NMSE|^\s*$" "$OUT/moe_kimi.log" | cut -c1-200 | tail -20
fi
if [ "$(left)" -gt 40 ]; then
  python3 bench/cuda/rank_cuts.py cut "$C/shared/configs/kimi-k2.5/config.json" 4 /tmp/kimi_4
  timeout 35 "$BIN/strata_bench_kit" rank_step_bench --config /tmp/kimi_4/config.json --tp-size 8 \
    --batches 1 --context 4096 --prefill 0 --reps 40 --variants defaults --timeline 2 >"$OUT/kimi_tl2.log" 2>&1
  grep -E "^decode|^variant|^timeline" "$OUT/kimi_tl2.log" | cut -c1-200
fi
echo "[session52c_check total @$(( $(date +%s) - t0 )) s]"
tar czf /tmp/logs.tgz -C "$OUT" . && mv /tmp/logs.tgz "$OUT/" && find "$OUT" -maxdepth 1 -name "*.log" -delete
