#!/bin/bash
# Session 50: the register GEMV's look-ahead (Int4NextWeights, linear_int4_next.cuh), not in main:
# `git apply bench/results/2026-12-07-session50-gemv-look-ahead.patch` first. Parity
# (Int4Parity.GemvRegLookAhead: the same outputs, no fault, beside GemvReg), then one 8B token's 128 W4A16 GEMVs with the look-ahead of 8 / 16 / 32 tiles a warp against the
# backend's knobs (int4_linear_bench --what ceilings,token, three rounds).
# Carry .devcarry/llfx; the tree without the hidden-state fixtures.
set -u
STRATA_CARRY=${STRATA_CARRY:-$PWD/.devcarry/llfx} source bench/cuda/device_env.sh
dev_begin strata_parity_test strata_bench_kit
L=$OUT BIN=./build-dev
dev_parity int4 "Int4Parity.GemvRegLookAhead:Int4Parity.GemvReg:Int4Parity.GemvRegSwiGlu" 200
timeout 300 ./build-dev/strata_bench_kit int4_linear_bench --what ceilings,token >"$OUT/token.log" 2>&1
grep -E "ceiling|^token" "$OUT/token.log" | sed -E 's/one decode token.s 128 W4A16 GEMVs //' | cut -c1-150
echo "[session50c_check total @$(( $(date +%s) - t0 )) s]"
