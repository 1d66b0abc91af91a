#!/bin/bash
# Session 51's second pack (PREBUILT=s51b: `bash bench/cuda/prebuilt.sh pack s51b strata_bench_kit
# strata_parity_test` with build-cuda configured Release; carry .devcarry/s51b and
# .devcarry/bench, the tree without tests/fixtures/hidden_states/*.safetensors): the register
# GEMV's unrounded form is now the signed one (magic_word_signed, no x group sums), for dense
# linears and the MoE experts mode alike.
#   1. parity: the INT4 GEMV suites, the add-norm merge, the tiny Llama W4A16 against Hugging
#      Face, the MoE suites (the experts mode), the DeepSeek INT4-experts fixture;
#   2. int4_linear_bench --what ceilings,scan,token (the backend's knobs now signed);
#   3. Llama-3.1-8B W4A16 decode steps at batch 1 / 4 / 8 (rank_step_bench, defaults);
#   4. on an H200, session48f_check.sh's rows within the call's time (owed since session 43).
set -u
STRATA_CARRY=${STRATA_CARRY:-$PWD/.devcarry/bench} source bench/cuda/device_env.sh
source bench/cuda/prebuilt.sh
prebuilt_begin "${PREBUILT:-s51b}" "$C" || exit 1
L=$OUT
dev_parity int4 "Int4Parity.*:Int4AddNorm.*:Fixtures/QuantModel.*:MoeParity.*:MoeBackend.*:GemvNorm.*:CudaFused*" 300
grep -E "^int4 reg 8B|greedy:" "$L/parity_int4.log" | head -16
timeout 200 "$BIN/strata_bench_kit" int4_linear_bench --what ceilings,scan,token \
  >"$OUT/int4_scan.log" 2>&1
grep -E -i "copy bandwidth|GEMM|fit|^scan|round" "$OUT/int4_scan.log" | cut -c1-180 | head -40
echo "[int4 @$(( $(date +%s) - t0 )) s]"
V=defaults
dev_rank_ab llama-3.1-8b-w4a16 1 512 1
dev_rank_ab llama-3.1-8b-w4a16 4 2048 1
dev_rank_ab llama-3.1-8b-w4a16 8 1024 1
echo "[llama @$(( $(date +%s) - t0 )) s]"
if [[ $gpu == *H200* ]]; then
  STRATA_CARRY=$C OUT=$OUT/rows PREBUILT=${PREBUILT:-s51b} timeout $(( 570 - $(date +%s) + t0 )) bash bench/cuda/session48f_check.sh
fi
echo "[session51b_check total @$(( $(date +%s) - t0 )) s]"
tar czf /tmp/logs.tgz -C "$OUT" . && mv /tmp/logs.tgz "$OUT/" && find "$OUT" -maxdepth 1 -name "*.log" -delete
