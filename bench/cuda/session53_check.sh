#!/bin/bash
# Session 53's call: the proj form of the fused MLA query (Moonlight / DeepSeek-V2-Lite; tunable
# mla_query_proj_fusion, variant mla_query_proj: since call 1 bench/results/2026-12-07-session53-
# mla-query-proj-smem.patch, apply it first) and session 52's prepared ring-16 raw-x patch, in one
# kit packed with both applied (`git apply bench/results/2026-12-07-session52-raw-x-
# ring16.patch`, `bash bench/cuda/prebuilt.sh pack s53 strata_bench_kit strata_parity_test`,
# patches reverted). Carry .devcarry/s53 and .devcarry/fxs, the tree without
# tests/fixtures/hidden_states/*.safetensors. BUDGET_S: the call's limit in seconds (default 575).
#   1. Parity: MlaQuery.* (the proj form bitwise against the separate launches at Moonlight's,
#      the V2-Lite fixture's and odd dims), the DeepSeek fixtures' greedy passes (the V2-Lite-style
#      fixture takes the proj form in its own pass), the INT4 suites (ring 16 reads x's row).
#   2. Moonlight batch 1 (27 layers, context 768): mla_query_proj against the defaults,
#      alternating in one process, two processes; the second with both timelines.
#   3. On an H200: the rows owed since session 43 (session10_check's llama kimi moonlight mla),
#      bounded to leave ~120 s.
#   4. With time left: the token's 128 W4A16 GEMVs (ring 16 / one block an SM rows) and Llama-3.1-8B
#      W4A16 batch 1 with int4_ring16 and int4_one_block.
set -u
STRATA_CARRY=${STRATA_CARRY:-$PWD/.devcarry/fxs} source bench/cuda/device_env.sh
source bench/cuda/prebuilt.sh
PREBUILT=${PREBUILT:-s53}
prebuilt_begin "$PREBUILT" "$C" || exit 1
left() { echo $(( ${BUDGET_S:-575} - $(date +%s) + t0 )); }
CFG=$C/shared/configs

timeout 150 "$BIN/strata_parity_test" --gtest_filter="MlaQuery.*:Fixtures/MlaModel.*/deepseek*:Int4Parity.*:Int4AddNorm.*" \
  >"$OUT/parity.log" 2>&1
echo "parity: exit $?; $(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/parity.log" | tr '\n' ' ')"
grep -E "^\[  FAILED  \]|Failure$" -A3 "$OUT/parity.log" | head -16
grep -E "^mla query .*proj" "$OUT/parity.log" | head -6
echo "[parity @$(( $(date +%s) - t0 )) s]"

for i in 1 2; do
  [ "$(left)" -gt 60 ] || break
  extra=""
  [ $i = 2 ] && extra="--timeline 1 --timeline-variants mla_query_proj"
  timeout 90 "$BIN/strata_bench_kit" rank_step_bench --config "$CFG/moonlight-16b-a3b/config.json" \
    --batches 1 --context 768 --prefill 0 --reps 100 --variants mla_query_proj,defaults,mla_query_proj \
    $extra >"$OUT/moonlight_$i.log" 2>&1
  echo "moonlight $i: exit $?"
  grep -E "^decode|^variant" "$OUT/moonlight_$i.log" | cut -c1-200
done
grep -E "^timeline" "$OUT/moonlight_2.log" | grep -iE "mla_query|gemv|per_head|mla_inputs|mla_decode|total" | cut -c1-200 | head -24
echo "[moonlight @$(( $(date +%s) - t0 )) s]"

if [[ $gpu == *H200* ]] && [ "$(left)" -gt 200 ]; then
  STRATA_CARRY=$C OUT=$OUT/rows STAGES="${ROW_STAGES:-llama kimi moonlight mla}" PREBUILT=$PREBUILT \
    LLAMA_CONFIG=llama-3.1-8b-w4a16 KIMI_CUTS="4 12" KIMI_BATCHES=1 MOONLIGHT_VARIANTS=mla_query_proj \
    timeout $(( $(left) - 120 )) bash bench/cuda/session10_check.sh 2>&1 | grep -vE "NMSE|^\s*$" | cut -c1-220
  echo "[rows @$(( $(date +%s) - t0 )) s]"
fi
if [ "$(left)" -gt 40 ]; then
  timeout 60 "$BIN/strata_bench_kit" int4_linear_bench --what token >"$OUT/token.log" 2>&1
  grep -E "^(ceiling  D2D|token)" "$OUT/token.log" | grep -v "round 0" | cut -c1-160
fi
for i in 1 2; do
  [ "$(left)" -gt 40 ] || break
  timeout 60 "$BIN/strata_bench_kit" rank_step_bench --config "$CFG/llama-3.1-8b-w4a16/config.json" \
    --batches 1 --context 512 --prefill 0 --reps 40 --variants int4_ring16,int4_one_block >"$OUT/llama_$i.log" 2>&1
  grep -E "^decode|^variant" "$OUT/llama_$i.log" | cut -c1-170
done
echo "[session53_check total @$(( $(date +%s) - t0 )) s]"
tar czf /tmp/logs.tgz -C "$OUT" . && mv /tmp/logs.tgz "$OUT/" && find "$OUT" -maxdepth 1 -name "*.log" -delete
