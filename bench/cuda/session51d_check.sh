#!/bin/bash
# Session 51: a patch of the W4A16 register GEMV against main, both built here. PATCH_NAME (the
# file's name in bench/results without .patch): 2026-12-07-session51-residual-l1-prefetch (the
# default; its residual rows into L1 right after the PDL wait: ran as call 3, neutral) or
# 2026-12-07-session51-raw-x-fragments (m = 1: B fragments read from x's row as the bulk copy or
# the norm prologue left it, no staging pass or barrier after x arrives; not yet run). Pack:
# `bash bench/cuda/prebuilt.sh pack NAME strata_bench_kit PATCH:strata_bench_kit
# PATCH:strata_parity_test` (PATCH: bench/results/PATCH_NAME.patch; PREBUILT=NAME, default s51p);
# carry .devcarry/NAME and .devcarry/bench, the tree without
# tests/fixtures/hidden_states/*.safetensors.
#   1. parity of the patched binary: the INT4 suites, the add-norm merge (bits equal to eager),
#      the tiny Llama W4A16 against Hugging Face;
#   2. Llama-3.1-8B W4A16 steps at batch 1 (512 keys) and 8 (1,024): main's kit and the patched
#      one in alternating processes, three each; one 8B token's 128 GEMVs with each kit;
#   3. on an H200, the owed rows with main's kit (session10_check stages kimi llama moonlight mla).
set -u
STRATA_CARRY=${STRATA_CARRY:-$PWD/.devcarry/bench} source bench/cuda/device_env.sh
source bench/cuda/prebuilt.sh
prebuilt_begin "${PREBUILT:-s51p}" "$C" || exit 1
L=$OUT P=${PATCH_NAME:-2026-12-07-session51-residual-l1-prefetch}_
timeout 200 "$BIN/${P}strata_parity_test" \
  --gtest_filter="Int4Parity.*:Int4AddNorm.*:Fixtures/QuantModel.*/llama_w4a16" >"$L/parity.log" 2>&1
echo "parity (patched): exit $?; $(grep -E '^\[  (PASSED|FAILED)  \]' "$L/parity.log" | tr '\n' ' ')"
grep -E "^\[  FAILED  \]|Failure$" -A3 "$L/parity.log" | head -12
for i in 1 2 3; do
  for kit in strata_bench_kit "${P}strata_bench_kit"; do
    for shape in "1 512" "8 1024"; do
      set -- $shape
      log="$OUT/${kit:0:8}_b$1_$i.log"
      timeout 100 "$BIN/$kit" rank_step_bench --config "$C/shared/configs/llama-3.1-8b-w4a16/config.json" \
        --batches "$1" --context "$2" --prefill 0 --reps 40 --variants defaults >"$log" 2>&1
      echo "$([ "$kit" = strata_bench_kit ] && echo main || echo patched) b$1 round $i: $(grep -E '^variant' "$log" | sed -E 's/.*step ([0-9.]+) ms.*default ([0-9.]+).*/\2 \/ \1 ms/')"
    done
  done
done
for kit in strata_bench_kit "${P}strata_bench_kit"; do
  timeout 100 "$BIN/$kit" int4_linear_bench --what token >"$OUT/token_${kit:0:8}.log" 2>&1
  grep -E "^token.*backend knobs" "$OUT/token_${kit:0:8}.log" | sed "s/^/${kit:0:8} /" | cut -c1-150
done
echo "[ab @$(( $(date +%s) - t0 )) s]"
if [[ $gpu == *H200* ]]; then
  STRATA_CARRY=$C OUT=$OUT/rows STAGES="kimi llama moonlight mla" PREBUILT=${PREBUILT:-s51p} \
    LLAMA_CONFIG=llama-3.1-8b-w4a16 KIMI_CUTS="4 12" KIMI_BATCHES=1 \
    timeout $(( 575 - $(date +%s) + t0 )) bash bench/cuda/session10_check.sh 2>&1 |
    grep -vE "NMSE|^\s*$" | cut -c1-220
fi
echo "[session51d_check total @$(( $(date +%s) - t0 )) s]"
tar czf /tmp/logs.tgz -C "$OUT" . && mv /tmp/logs.tgz "$OUT/" && find "$OUT" -maxdepth 1 -name "*.log" -delete
