#!/bin/bash
# Session 52's second call: main with the raw-x register GEMV (PREBUILT=s52b: `bash
# bench/cuda/prebuilt.sh pack s52b strata_bench_kit strata_parity_test`; carry .devcarry/s52b and
# .devcarry/fxs, the tree without tests/fixtures/hidden_states/*.safetensors).
#   1. parity: the INT4 suites, the add-norm merge, every quantized fixture (the tiny Llama W4A16
#      and the DeepSeek ones: INT4 experts, FP8 block) against Hugging Face, the MoE suites;
#   2. on an H200: the rows owed since session 43 (session10_check stages llama kimi moonlight
#      mla), bounded to ~330 s;
#   3. with the time left: one 8B token's 128 GEMVs; the Moonlight batch-1 step's kernel listing
#      (rank_step_bench --timeline 2), its layer read kernel by kernel for the next target.
set -u
STRATA_CARRY=${STRATA_CARRY:-$PWD/.devcarry/fxs} source bench/cuda/device_env.sh
source bench/cuda/prebuilt.sh
PREBUILT=${PREBUILT:-s52b}
prebuilt_begin "$PREBUILT" "$C" || exit 1
left() { echo $(( 575 - $(date +%s) + t0 )); }
timeout 200 "$BIN/strata_parity_test" \
  --gtest_filter="Int4Parity.*:Int4AddNorm.*:Fixtures/QuantModel.*:Fixtures/*Deepseek*:*deepseek*:MoeBackend.*:MoeParity.*" \
  >"$OUT/parity.log" 2>&1
echo "parity: exit $?; $(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/parity.log" | tr '\n' ' ')"
grep -E "^\[  FAILED  \]|Failure$" -A3 "$OUT/parity.log" | head -12
grep -E "greedy:|nmse" "$OUT/parity.log" | head -12 | cut -c1-160
echo "[parity @$(( $(date +%s) - t0 )) s]"
if [[ $gpu == *H200* ]]; then
  STRATA_CARRY=$C OUT=$OUT/rows STAGES="llama kimi moonlight mla" PREBUILT=$PREBUILT \
    LLAMA_CONFIG=llama-3.1-8b-w4a16 KIMI_CUTS="4 12" KIMI_BATCHES=1 \
    timeout $(( $(left) - 60 )) bash bench/cuda/session10_check.sh 2>&1 | grep -vE "NMSE|^\s*$" | cut -c1-220
  echo "[rows @$(( $(date +%s) - t0 )) s]"
fi
if [ "$(left)" -gt 30 ]; then
  timeout 40 "$BIN/strata_bench_kit" int4_linear_bench --what token >"$OUT/token.log" 2>&1
  grep -E "^(ceiling  D2D|token.*backend knobs)" "$OUT/token.log" | cut -c1-150
fi
if [ "$(left)" -gt 30 ]; then
  timeout 35 "$BIN/strata_bench_kit" rank_step_bench --config "$C/shared/configs/moonlight-16b-a3b/config.json" \
    --batches 1 --context 768 --prefill 0 --reps 40 --variants defaults --timeline 2 >"$OUT/moon_tl2.log" 2>&1
  grep -E "^decode|^variant|^timeline" "$OUT/moon_tl2.log" | cut -c1-200
fi
echo "[session52b_check total @$(( $(date +%s) - t0 )) s]"
tar czf /tmp/logs.tgz -C "$OUT" . && mv /tmp/logs.tgz "$OUT/" && find "$OUT" -maxdepth 1 -name "*.log" -delete
