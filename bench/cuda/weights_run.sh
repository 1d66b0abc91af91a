#!/bin/bash
# Issue 21 (weights in their stored format) on the GPU machine, from the repository root,
# `.devcarry/cuda` carried (debs + house-llama, the tiny fixtures, configs). One call:
#   fixtures  python3 tests/fixtures/make_quant_fixtures.py (transformers 5.17 references of the
#             tiny W4A16 Llama and FP8-block DeepSeek-V3), copied into tests/fixtures/tiny so the
#             parity suite below reads them; $OUT/fixtures.tgz brings them back;
#   int4      bench/cuda/int4_linear_run.sh (parity *Int4*, strata_bench_int4_linear_bench);
#   fp8       bench/cuda/fp8_linear_run.sh (parity Fp8Linear.*, strata_bench_fp8_linear_bench);
#   parity    the rest of strata_parity_test (ops, fused ops, models vs the HF fixtures);
#   model     W4A16 / FP8-block model checks (WEIGHTS_MODEL_FILTER, default '*Quant*');
#   decode    batch-1 decode of the Llama-3.1-8B shape, W4A16 (group 128, bf16 lm_head) and bf16,
#             random weights in the stored format (llama_bench --what ceilings,decode, DECODE_MODES
#             default 3,4: graphs + fused ops, host / GPU greedy);
#   offline   the engine's offline throughput, 1,000 x 1,024/1,024 on the 8B shape, bf16
#             (offline_bench, OFFLINE_ARGS default --mem-fraction 0.92).
# STAGES picks stages (default all, in that order). Every log lands in $OUT/logs.tgz (the device
# tool brings back at most 8 files).
set -u
FINAL_OUT=${OUT:-/tmp/strata_out}
W=/tmp/weights_run
rm -rf "$W" && mkdir -p "$W"
export OUT=$W/common
source bench/cuda/device_env.sh
t0=$(date +%s)
dev_configure
dev_build strata_parity_test strata_bench_int4_linear_bench strata_bench_fp8_linear_bench strata \
  strata_bench_llama_bench strata_bench_offline_bench
echo "build: $(( $(date +%s) - t0 )) s"
for stage in ${STAGES:-fixtures int4 fp8 parity model}; do
  t1=$(date +%s)
  case $stage in
    fixtures)
      PYTHONUNBUFFERED=1 timeout 240 python3 tests/fixtures/make_quant_fixtures.py "$W/fixtures" >"$W/fixtures.log" 2>&1
      echo "fixtures: rc $?"; tail -5 "$W/fixtures.log"
      if [ -d "$W/fixtures/tiny" ]; then
        mkdir -p tests/fixtures/tiny && cp -r "$W"/fixtures/tiny/* tests/fixtures/tiny/
        tar czf "$FINAL_OUT/fixtures.tgz" -C "$W/fixtures" tiny
      fi ;;
    int4)
      OUT=$W/int4 STAGES="${INT4_STAGES:-resources parity bench}" bash bench/cuda/int4_linear_run.sh 2>&1 | grep -v "^build:" ;;
    fp8)
      OUT=$W/fp8 STAGES="${FP8_STAGES:-parity bench}" bash bench/cuda/fp8_linear_run.sh 2>&1 | grep -v "^build:" ;;
    parity)
      timeout ${PARITY_TIMEOUT:-200} ./build-dev/strata_parity_test --gtest_filter="${PARITY_FILTER:--*Int4*:Fp8Linear.*:*Quant*}" \
        >"$W/parity.log" 2>&1
      echo "parity: rc $?"
      grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure|CHECK|Expected|Which is" "$W/parity.log" | head -60 ;;
    model)
      timeout 120 ./build-dev/strata_parity_test --gtest_filter="${WEIGHTS_MODEL_FILTER:-*Quant*}" >"$W/model.log" 2>&1
      echo "model: rc $?"
      grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure|CHECK|Expected|Which is|bytes|rel max|nmse" "$W/model.log" | head -60 ;;
    decode)
      for cfg in llama-3.1-8b-w4a16 llama-3.1-8b; do
        DECODE_MODES=${DECODE_MODES:-3,4} timeout 200 ./build-dev/strata_bench_llama_bench --what ceilings,decode \
          --config "$C/shared/configs/$cfg/config.json" >"$W/decode_$cfg.log" 2>&1
        echo "decode $cfg: rc $?"; grep -E "^ceiling|^model|^decode" "$W/decode_$cfg.log"
      done ;;
    offline)
      timeout 300 ./build-dev/strata_bench_offline_bench --config "$C/shared/configs/llama-3.1-8b/config.json" \
        --tokenizer "$C/shared/models/house-llama" ${OFFLINE_ARGS:---mem-fraction 0.92} >"$W/offline.log" 2>&1
      echo "offline: rc $?"; tail -8 "$W/offline.log" ;;
  esac
  echo "-- $stage: $(( $(date +%s) - t1 )) s"
done
tar czf "$FINAL_OUT/logs.tgz" -C "$W" --exclude=fixtures .
echo "total: $(( $(date +%s) - t0 )) s"
