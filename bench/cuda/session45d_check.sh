#!/bin/bash
# Session 45's prefetch A/B (carry .devcarry/k50k — strata_bench_kit at 73cb598 — .devcarry/k51 —
# the same with the W4A16 norm prologue's weights prefetched into L2 before the PDL wait — and
# .devcarry/fxs): Llama-3.1-8B W4A16 at batch 1, the two binaries in alternating processes, each
# with the split on (defaults) and off (no_int4_add_norm). The prefetch changes no bits.
set -u
OUT=${OUT:-/tmp/strata_out}
t0=$(date +%s)
for i in 1 2 3; do
  for k in k50k k51; do
    OUT=$OUT/$k-$i STRATA_CARRY=$PWD/.devcarry/fxs PREBUILT=$k STAGES=llama \
      LLAMA_CONFIG=llama-3.1-8b-w4a16 LLAMA_VARIANTS=defaults,no_int4_add_norm,defaults,no_int4_add_norm \
      bash bench/cuda/session10_check.sh 2>&1 | grep -E "^variant" | sed "s/^/$k /" | cut -c1-80
  done
done
echo "[session45d_check total @$(( $(date +%s) - t0 )) s]"
