#!/bin/bash
# Session 52's last call, prepared and not run (no device start came): the raw-x form instantiated
# for ring 16 too, and the variants int4_ring16 / int4_one_block and the token bench's rows for
# them — all in bench/results/2026-12-07-session52-raw-x-ring16.patch. To run: `git apply` that
# patch, `bash bench/cuda/prebuilt.sh pack s52d strata_bench_kit strata_parity_test`, revert the
# patch (commit it only if it wins); carry .devcarry/s52d and .devcarry/fxs, the tree without
# tests/fixtures/hidden_states/*.safetensors. BUDGET_S: the call's limit in seconds (default
# 575); ROW_STAGES: session10_check's stages on an H200 (default "llama kimi moonlight mla").
#   On an H200, first: the rows owed since session 43 (session10_check stages llama kimi
#   moonlight mla), bounded to leave ~150 s.
#   Then: parity of the INT4 suites (ring 16 at one token now reads x's row); one 8B token's 128
#   GEMVs with the backend's knobs, ring 16, and one block an SM with ring 16; Llama-3.1-8B W4A16
#   batch 1 with int4_ring16 and int4_one_block against the defaults (rank_step_bench, alternating
#   in one process, two processes); with time left, a Kimi-K2.5 rank's MoE layer at 1 and 2 tokens
#   and a 4-layer Kimi cut's kernel listing.
set -u
STRATA_CARRY=${STRATA_CARRY:-$PWD/.devcarry/fxs} source bench/cuda/device_env.sh
source bench/cuda/prebuilt.sh
PREBUILT=${PREBUILT:-s52d}
prebuilt_begin "$PREBUILT" "$C" || exit 1
left() { echo $(( ${BUDGET_S:-575} - $(date +%s) + t0 )); }  # BUDGET_S: the call's limit
if [[ $gpu == *H200* ]]; then
  STRATA_CARRY=$C OUT=$OUT/rows STAGES="${ROW_STAGES:-llama kimi moonlight mla}" PREBUILT=$PREBUILT \
    LLAMA_CONFIG=llama-3.1-8b-w4a16 KIMI_CUTS="4 12" KIMI_BATCHES=1 \
    timeout $(( $(left) - 150 )) bash bench/cuda/session10_check.sh 2>&1 | grep -vE "NMSE|^\s*$" | cut -c1-220
  echo "[rows @$(( $(date +%s) - t0 )) s]"
fi
timeout 100 "$BIN/strata_parity_test" \
  --gtest_filter="Int4Parity.*:Int4AddNorm.*:Fixtures/QuantModel.*/llama_w4a16" >"$OUT/parity.log" 2>&1
echo "parity: exit $?; $(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/parity.log" | tr '\n' ' ')"
grep -E "^\[  FAILED  \]|Failure$" -A3 "$OUT/parity.log" | head -12
if [ "$(left)" -gt 40 ]; then
  timeout 60 "$BIN/strata_bench_kit" int4_linear_bench --what token >"$OUT/token.log" 2>&1
  grep -E "^(ceiling  D2D|token)" "$OUT/token.log" | grep -v "round 0" | cut -c1-160
fi
for i in 1 2; do
  [ "$(left)" -gt 40 ] || break
  timeout 60 "$BIN/strata_bench_kit" rank_step_bench --config "$C/shared/configs/llama-3.1-8b-w4a16/config.json" \
    --batches 1 --context 512 --prefill 0 --reps 40 --variants int4_ring16,int4_one_block >"$OUT/llama_$i.log" 2>&1
  grep -E "^decode|^variant" "$OUT/llama_$i.log" | cut -c1-170
done
if [ "$(left)" -gt 60 ]; then
  timeout 60 "$BIN/strata_bench_kit" moe_bench --what backend --backend-configs kimi --tokens 1,2 \
    >"$OUT/moe_kimi.log" 2>&1
  grep -vE "NMSE|^\s*$" "$OUT/moe_kimi.log" | cut -c1-200 | tail -12
fi
if [ "$(left)" -gt 40 ]; then
  python3 bench/cuda/rank_cuts.py cut "$C/shared/configs/kimi-k2.5/config.json" 4 /tmp/kimi_4
  timeout 35 "$BIN/strata_bench_kit" rank_step_bench --config /tmp/kimi_4/config.json --tp-size 8 \
    --batches 1 --context 4096 --prefill 0 --reps 40 --variants defaults --timeline 2 >"$OUT/kimi_tl2.log" 2>&1
  grep -E "^decode|^timeline" "$OUT/kimi_tl2.log" | cut -c1-200
fi
echo "[session52d_check total @$(( $(date +%s) - t0 )) s]"
tar czf /tmp/logs.tgz -C "$OUT" . && mv /tmp/logs.tgz "$OUT/" && find "$OUT" -maxdepth 1 -name "*.log" -delete
