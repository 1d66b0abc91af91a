#!/bin/bash
# Issue 22's 16-head row (>= 85% of copy on an H200; the decode kernel reads 82.7-85.7%): the
# prepared wgmma kernel with the keys as M (bench/results/2026-12-06-session39-mla-keys-m.patch,
# MlaPlanOptions::keys_m), binaries built and packed on the CPU machine (no build here):
#   here:   P=bench/results/2026-12-06-session39-mla-keys-m.patch
#           bash bench/cuda/prebuilt.sh pack s39k $P:strata_parity_test $P:strata_bench_mla_bench \
#             $P:strata_bench_rank_step_bench
#   device: (carry .devcarry/s39k, .devcarry/fxd and .devcarry/cfg)  bash bench/cuda/mla_keys_check.sh
# In order: its parity against the CPU twin (MlaAttention.KeysAsM; the bench runs only if it
# passes), then `mla_bench --what ceilings,keys,acceptance` twice (the kernel at 16 and 8 heads
# beside the decode kernel, its output's NMSE against the product plan's; the product's rows,
# 128 heads with the row-tile pairs among them), then (OWED=1, the default) the Kimi-K2.5 rank and
# Moonlight at batch 1, each also with the kernel in the step (variant mla_keys: 8 and 16 heads)
# when the parity passed. If the kernel passes and gains, it becomes the 16-row plan's kernel
# (with MlaAttention.* and the DeepSeek fixtures through it) in a later call.
set -u
OUT=${OUT:-/tmp/strata_out}
mkdir -p "$OUT"
t0=$(date +%s)
PREBUILT=${PREBUILT:-s39k}
source bench/cuda/prebuilt.sh unpack "$PREBUILT" || exit 1
# The parity binary reads the fixtures where they were on the CPU machine (../shared).
prebuilt_link_shared "$PWD/.devcarry/fxd"
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
T=2026-12-06-session39-mla-keys-m
timeout 120 "$PB/${T}_strata_parity_test" --gtest_filter='MlaAttention.KeysAsM' >"$OUT/parity.log" 2>&1
rc=$?
echo "[parity @$(( $(date +%s) - t0 )) s] exit $rc"
grep -E "wgmma-keys|^\[  (PASSED|FAILED) |Failure|error" "$OUT/parity.log" | cut -c1-240 | head -30
if [ $rc -eq 0 ]; then
  for i in 1 2; do
    timeout 120 "$PB/${T}_strata_bench_mla_bench" --what ceilings,keys,acceptance >"$OUT/mla_$i.log" 2>&1
    echo "[mla $i @$(( $(date +%s) - t0 )) s] exit $?"
    grep -E "^ceiling|^mla|^keys|^pairs" "$OUT/mla_$i.log" | sed 's/ of latent rows//' | cut -c1-230
  done
fi
if [ "${OWED:-1}" = 1 ]; then
  # The patched rank_step_bench under session10_check's name for it.
  ln -sf "$PB/${T}_strata_bench_rank_step_bench" "$PB/strata_bench_rank_step_bench"
  v=segments64
  [ $rc -eq 0 ] && v=segments64,mla_keys
  STRATA_CARRY=$PWD/.devcarry/cfg PREBUILT=$PREBUILT STAGES="kimi moonlight" KIMI_CUTS="4 12" \
    KIMI_BATCHES=1 KIMI_VARIANTS=$v MOONLIGHT_VARIANTS=$v bash bench/cuda/session10_check.sh
fi
echo "total: $(( $(date +%s) - t0 )) s"
