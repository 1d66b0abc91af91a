#!/bin/bash
# The host KV tier under tensor parallelism on GPUs (issue 32), on a 2-GPU kind (nvidia-h200-x2),
# from the repository root: builds strata_parity_test and runs HicacheTpParity (house-llama at
# tp 2 with and without the tier, write_through and write_back, kernel and direct copies: equal
# greedy outputs, every rank's promoted and backed-up pages equal rank 0's). ~2-3 min with the
# build. Carry: .devcarry/cuda (house-llama). Logs go to $OUT.
# The tp 1 tier (one GPU, unchanged): bench/cuda/hicache_engine_check.sh and hicache_run.sh.
set -u
source bench/cuda/device_env.sh  # OUT, C, PKG, dev_configure, dev_build
nvidia-smi -L
t0=$(date +%s)
dev_configure
dev_build strata_parity_test
echo "build: $(( $(date +%s) - t0 )) s"
export NCCL_NVLS_ENABLE=0
timeout 240 ./build-dev/strata_parity_test --gtest_filter="HicacheTpParity*" >"$OUT/hicache_tp.log" 2>&1
echo "hicache tp parity: exit status $?"
grep -vE "^\[ *(RUN|OK) |^\[20" "$OUT/hicache_tp.log" | tail -40
echo "total: $(( $(date +%s) - t0 )) s"
