#!/bin/bash
# Checks the CUDA backend after its layout by op family (issue 21: dispatch.cc split into the
# family files, tunables in CudaTunables, the graph recorder its own class, the non-default
# kernel variants moved to bench/cuda/dev, the CPU twin's declared table) on the GPU machine,
# from the repository root, `.devcarry/cuda` carried. Nothing was meant to change what the GPU
# computes, so every stage compares against an existing bound or record:
#   1. build every CUDA target (strata, both parity binaries, every benchmark);
#   2. parity, one process per filter: the op suites (PARITY_OPS), the model suites
#      (PARITY_MODELS), the development kernels (strata_dev_parity_test, DEV_FILTER);
#   3. llama_bench --what ceilings,decode with DECODE_MODES=3,4 (graphs + PDL + fused ops, host
#      argmax / GPU greedy): batch-1 decode of the 8B shape, RESULTS' 4.142 ms/token (mode 4).
# STAGES="parity dev bench" selects (default all). About 4 minutes on one H200 after the build.
# The tp suites (NcclComm.*, TpParity*) need two GPUs: bench/cuda/tp2_run.sh.
set -u
source bench/cuda/device_env.sh  # OUT, C, PKG, dev_configure, dev_build; carried deps unpacked
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
t0=$(date +%s)
dev_configure
dev_build strata strata_parity_test strata_dev_parity_test strata_bench_llama_bench \
  strata_bench_offline_bench strata_bench_hicache_bench strata_bench_overlap_bench
echo "build: $(( $(date +%s) - t0 )) s"
OPS=${PARITY_OPS:-'CudaParity.*:CudaFusedParity.*:KvFp8.*:CudaSampling*'}
MODELS=${PARITY_MODELS:-'Fixtures/CudaModel.*:CudaModel*'}
DEV=${DEV_FILTER:-'DevParity.*'}
for stage in ${STAGES:-parity dev bench}; do
  case $stage in
    parity)
      for f in "$OPS" "$MODELS"; do
        t1=$(date +%s)
        # Into a file first: a pipe closed early (head) would kill the suite with SIGPIPE mid-run.
        timeout ${PARITY_S:-300} ./build-dev/strata_parity_test --gtest_filter="$f" >"$OUT/parity.log" 2>&1
        echo "parity $f: rc $? ($(( $(date +%s) - t1 )) s)"
        grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure|DIFFER" "$OUT/parity.log" | head -30
        cp "$OUT/parity.log" "$OUT/parity_$(echo "$f" | tr -c 'A-Za-z0-9' _ | cut -c1-40).log"
      done ;;
    dev)
      t1=$(date +%s)
      timeout ${PARITY_S:-300} ./build-dev/strata_dev_parity_test --gtest_filter="$DEV" >"$OUT/parity_dev.log" 2>&1
      echo "parity dev $DEV: rc $? ($(( $(date +%s) - t1 )) s)"
      grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure|DIFFER|prefill kernel" "$OUT/parity_dev.log" | head -30 ;;
    bench)
      t1=$(date +%s)
      DECODE_MODES=${DECODE_MODES:-3,4} timeout 240 ./build-dev/strata_bench_llama_bench \
        --what ceilings,decode >"$OUT/bench.log" 2>&1
      echo "bench: rc $? ($(( $(date +%s) - t1 )) s)"
      grep -E "ceiling|decode   \[|graphs   " "$OUT/bench.log" ;;
  esac
done
echo "total: $(( $(date +%s) - t0 )) s"
