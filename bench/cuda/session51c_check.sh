#!/bin/bash
# Session 51's last pack call (PREBUILT=s51b, 6f68145: the W4A16 GEMV's signed form; carry
# .devcarry/s51b and .devcarry/fxs, the tree without tests/fixtures/hidden_states/*.safetensors).
# On an H200: the rows owed since session 43, one process each, within the call (session10_check
# stages llama (W4A16), kimi (4- and 12-layer cuts, batch 1), moonlight, mla; then the Kimi rank
# again in a second process). On any other GPU: the DeepSeek and MoE fixture suites (the pack's
# first call had no ../shared/fixtures), then the Llama W4A16 rows again; with ROWS_ONLY=1
# nothing.
set -u
STRATA_CARRY=${STRATA_CARRY:-$PWD/.devcarry/fxs} source bench/cuda/device_env.sh
source bench/cuda/prebuilt.sh
prebuilt_begin "${PREBUILT:-s51b}" "$C" || exit 1
L=$OUT
if [[ $gpu == *H200* ]]; then
  rows() {  # TAG STAGES
    STRATA_CARRY=$C OUT=$OUT/$1 STAGES=$2 PREBUILT=${PREBUILT:-s51b} LLAMA_CONFIG=llama-3.1-8b-w4a16 \
      KIMI_CUTS="4 12" KIMI_BATCHES=1 timeout $(( 575 - $(date +%s) + t0 )) \
      bash bench/cuda/session10_check.sh 2>&1 | grep -vE "NMSE|^\s*$" | cut -c1-220
    echo "[$1 @$(( $(date +%s) - t0 )) s]"
  }
  rows a "kimi llama moonlight mla"
  rows b "kimi"
elif [ -n "${ROWS_ONLY:-}" ]; then
  echo "not an H200: nothing run (ROWS_ONLY)"
else
  dev_parity fixtures "Fixtures/QuantModel.*:Fixtures/*Deepseek*:*deepseek*:MoeBackend.*" 240
  grep -E "greedy:|nmse" "$L/parity_fixtures.log" | head -20
  V=defaults
  dev_rank_ab llama-3.1-8b-w4a16 1 512 2
fi
echo "[session51c_check total @$(( $(date +%s) - t0 )) s]"
tar czf /tmp/logs.tgz -C "$OUT" . && mv /tmp/logs.tgz "$OUT/" && find "$OUT" -maxdepth 1 -name "*.log" -delete
