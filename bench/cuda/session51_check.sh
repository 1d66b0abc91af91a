#!/bin/bash
# Ran as session 51's call 1 (PREBUILT=s51, packed at 071d596; H100: 2026-12-07-session51.md);
# the form won and replaced the magic one in the next commit (variant int4_signed gone): the
# script needs 071d596's tree. Session 51's call: the W4A16 register GEMV's signed form
# (gemv_round = kInt4FormSigned: each
# magic word minus 136 in one bf16x2 fma, so x is staged without its −136·Σx group sums; tunable
# int4_gemv_form, variant int4_signed). Carry .devcarry/llfx and the tree without
# tests/fixtures/hidden_states/*.safetensors (restore: git checkout -- tests/fixtures); or, built
# here (no device time building), PREBUILT=s51 with .devcarry/s51 (`bash bench/cuda/prebuilt.sh
# pack s51 strata_bench_kit strata_parity_test`, build-cuda configured Release) and
# .devcarry/bench (STRATA_CARRY=$PWD/.devcarry/bench), the same tree.
#   1. parity: the INT4 GEMVs' suites (the signed knob sets), the tiny Llama W4A16 against
#      Hugging Face in both forms, the add-norm merge;
#   2. int4_linear_bench --what ceilings,scan,token: the scan fits both forms (µs a launch +
#      streaming rate), the token has a signed row beside the backend's knobs;
#   3. Llama-3.1-8B W4A16 batch 1 after 512 (rank_step_bench), int4_signed against the defaults,
#      two processes;
#   4. on an H200, session48f_check.sh's rows within the call's time (owed since session 43).
set -u
STRATA_CARRY=${STRATA_CARRY:-$PWD/.devcarry/llfx} source bench/cuda/device_env.sh
if [ -n "${PREBUILT:-}" ]; then
  source bench/cuda/prebuilt.sh
  prebuilt_begin "$PREBUILT" "$C" || exit 1
else
  dev_begin strata_parity_test strata_bench_kit
  BIN=./build-dev
fi
L=$OUT
dev_parity int4 "Int4Parity.Gemv*:Fixtures/QuantModel.LogitsMatchHuggingFace/llama_w4a16*:Int4AddNorm.*" 240
grep -E "^int4 reg 8B|llama_w4a16.* (seq0|greedy)" "$L/parity_int4.log" | head -12
timeout 200 "$BIN/strata_bench_kit" int4_linear_bench --what ceilings,scan,token \
  >"$OUT/int4_scan.log" 2>&1
grep -E -i "copy bandwidth|GEMM|fit|^scan|round" "$OUT/int4_scan.log" | cut -c1-180 | head -50
echo "[int4 @$(( $(date +%s) - t0 )) s]"
V=int4_signed,defaults
for i in 1 2; do dev_rank_ab llama-3.1-8b-w4a16 1 512 $i; done
echo "[llama @$(( $(date +%s) - t0 )) s]"
if [[ $gpu == *H200* ]]; then
  STRATA_CARRY=$C OUT=$OUT/rows PREBUILT=${PREBUILT:-} timeout $(( 570 - $(date +%s) + t0 )) bash bench/cuda/session48f_check.sh
fi
echo "[session51_check total @$(( $(date +%s) - t0 )) s]"
tar czf /tmp/logs.tgz -C "$OUT" . && mv /tmp/logs.tgz "$OUT/" && find "$OUT" -maxdepth 1 -name "*.log" -delete
