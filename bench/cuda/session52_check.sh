#!/bin/bash
# Session 52's first call. Pack (here): `bash bench/cuda/prebuilt.sh pack s52e strata_bench_kit
# PATCH:strata_bench_kit PATCH:strata_parity_test` with PATCH = bench/results/2026-12-07-session51-
# raw-x-fragments.patch; carry .devcarry/s52e and .devcarry/bench, the tree without
# tests/fixtures/hidden_states/*.safetensors.
#   On an H200, first: the rows owed since session 43 with main's kit (session10_check stages
#   kimi llama moonlight mla; Llama W4A16 batch 1, the Kimi rank's 4- and 12-layer cuts at batch
#   1, Moonlight batch 1, the MLA acceptance rows), bounded to ~330 s.
#   Then, on any GPU, with the time left: session51d_check's A/B of the raw-x patch (parity of the
#   patched binary; Llama-3.1-8B W4A16 steps at batch 1 and 8 in alternating processes; one 8B
#   token's 128 GEMVs with each kit).
set -u
STRATA_CARRY=${STRATA_CARRY:-$PWD/.devcarry/bench} source bench/cuda/device_env.sh
source bench/cuda/prebuilt.sh
PREBUILT=${PREBUILT:-s52e}
prebuilt_begin "$PREBUILT" "$C" || exit 1
if [[ $gpu == *H200* ]]; then
  STRATA_CARRY=$C OUT=$OUT/rows STAGES="llama kimi moonlight mla" PREBUILT=$PREBUILT \
    LLAMA_CONFIG=llama-3.1-8b-w4a16 KIMI_CUTS="4 12" KIMI_BATCHES=1 \
    timeout 330 bash bench/cuda/session10_check.sh 2>&1 | grep -vE "NMSE|^\s*$" | cut -c1-220
  echo "[rows @$(( $(date +%s) - t0 )) s]"
fi
L=$OUT P=2026-12-07-session51-raw-x-fragments_
left() { echo $(( 575 - $(date +%s) + t0 )); }
timeout 150 "$BIN/${P}strata_parity_test" \
  --gtest_filter="Int4Parity.*:Int4AddNorm.*:Fixtures/QuantModel.*/llama_w4a16" >"$L/parity.log" 2>&1
echo "parity (patched): exit $?; $(grep -E '^\[  (PASSED|FAILED)  \]' "$L/parity.log" | tr '\n' ' ')"
grep -E "^\[  FAILED  \]|Failure$" -A3 "$L/parity.log" | head -12
for kit in strata_bench_kit "${P}strata_bench_kit"; do
  [ "$(left)" -gt 30 ] || break
  timeout 60 "$BIN/$kit" int4_linear_bench --what ceilings,token >"$OUT/token_${kit:0:8}.log" 2>&1
  grep -E "^(summary  copy|ceiling|token.*backend knobs)" "$OUT/token_${kit:0:8}.log" | sed "s/^/${kit:0:8} /" | cut -c1-150
done
for i in 1 2 3; do
  for kit in strata_bench_kit "${P}strata_bench_kit"; do
    for shape in "1 512" "8 1024"; do
      [ "$(left)" -gt 25 ] || break 3
      set -- $shape
      log="$OUT/${kit:0:8}_b$1_$i.log"
      timeout 60 "$BIN/$kit" rank_step_bench --config "$C/shared/configs/llama-3.1-8b-w4a16/config.json" \
        --batches "$1" --context "$2" --prefill 0 --reps 40 --variants defaults >"$log" 2>&1
      echo "$([ "$kit" = strata_bench_kit ] && echo main || echo raw-x) b$1 round $i: $(grep -E '^variant' "$log" | sed -E 's/.*step ([0-9.]+) ms.*default ([0-9.]+).*/\2 \/ \1 ms/')"
    done
  done
done
# Where Moonlight's batch-1 step goes (the next target's plan): one timeline with main's kit.
if [ "$(left)" -gt 40 ]; then
  timeout 35 "$BIN/strata_bench_kit" rank_step_bench --config "$C/shared/configs/moonlight-16b-a3b/config.json" \
    --batches 1 --context 768 --prefill 0 --reps 40 --variants defaults --timeline 1 >"$OUT/moon_tl.log" 2>&1
  grep -E "^decode|^variant" "$OUT/moon_tl.log" | cut -c1-200
  awk '/^timeline/ {on = 1; print; next} /^  +# / || !/^  / {on = 0} on' "$OUT/moon_tl.log" | cut -c1-130 | head -60
fi
# And a Kimi-K2.5 rank's (a 4-layer cut at batch 1, tp 8).
if [ "$(left)" -gt 40 ]; then
  python3 bench/cuda/rank_cuts.py cut "$C/shared/configs/kimi-k2.5/config.json" 4 /tmp/kimi_4
  timeout 35 "$BIN/strata_bench_kit" rank_step_bench --config /tmp/kimi_4/config.json --tp-size 8 \
    --batches 1 --context 4096 --prefill 0 --reps 40 --variants defaults --timeline 1 >"$OUT/kimi_tl.log" 2>&1
  grep -E "^decode|^variant" "$OUT/kimi_tl.log" | cut -c1-200
  awk '/^timeline/ {on = 1; print; next} /^  +# / || !/^  / {on = 0} on' "$OUT/kimi_tl.log" | cut -c1-130 | head -60
fi
echo "[session52_check total @$(( $(date +%s) - t0 )) s]"
tar czf /tmp/logs.tgz -C "$OUT" . && mv /tmp/logs.tgz "$OUT/" && find "$OUT" -maxdepth 1 -name "*.log" -delete
