#!/bin/bash
# The tensor-core GEMV for decode batches 2..64 (bench/cuda/dev/gemv_mma.cu, a development kernel
# the product does not run) on the GPU machine, from the repository root, `.devcarry/cuda`
# carried: builds the parity tests and llama_bench, then
#   1. parity: the mma kernel's cases (strata_dev_parity_test: DevParity.LinearMma,
#      DevParity.LinearSiluMulMma; DEV_OPS) and the product's GEMV/linear suites around it
#      (strata_parity_test, PARITY_OPS), each in its own process, logs in $OUT;
#   2. llama_bench --what ceilings,gemv: the batch-1 GEMV variants, then per 8B linear and
#      m = 1..64 the mma kernel vs the FMA GEMV vs cuBLAS, and one decode step's linears per m.
# (Its offline-engine runs, STRATA_GEMV_MMA=1, ended when it left the product: bench/RESULTS.md.)
# Stages can be skipped: STAGES="parity bench" (default both).
set -u
source bench/cuda/device_env.sh  # OUT, C, PKG, dev_configure, dev_build; carried deps unpacked
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
t0=$(date +%s)
dev_configure
dev_build strata_parity_test strata_dev_parity_test strata_bench_llama_bench
echo "build: $(( $(date +%s) - t0 )) s"
DEV_OPS=${DEV_OPS:-'DevParity.LinearMma:DevParity.LinearSiluMulMma'}
OPS=${PARITY_OPS:-'CudaParity.Linear:CudaParity.LinearSplitK:CudaFusedParity.LinearSiluMul:CudaParity.PerHeadLinear'}
for stage in ${STAGES:-parity bench}; do
  case $stage in
    parity)
      t1=$(date +%s)
      ./build-dev/strata_dev_parity_test --gtest_filter="$DEV_OPS" >"$OUT/parity_dev.log" 2>&1
      echo "parity dev: rc $? ($(( $(date +%s) - t1 )) s)"
      grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|^\[       OK|DIFFER|Failure" "$OUT/parity_dev.log" | head -40
      grep -E "linear mma (warps/SM 24 m=(8|32|64) k=264|m=(8|32) k=14336)|linear_silu_mul mma m=(2|32|64) k=4104" \
        "$OUT/parity_dev.log" | head -12
      t1=$(date +%s)
      ./build-dev/strata_parity_test --gtest_filter="$OPS" >"$OUT/parity_ops.log" 2>&1
      echo "parity ops: rc $? ($(( $(date +%s) - t1 )) s)"
      grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|^\[       OK|DIFFER|Failure" "$OUT/parity_ops.log" | head -40 ;;
    bench)
      t1=$(date +%s)
      ./build-dev/strata_bench_llama_bench --what ceilings,gemv >"$OUT/bench.log" 2>&1
      echo "bench: rc $? ($(( $(date +%s) - t1 )) s)"
      grep -E "ceiling|gemv " "$OUT/bench.log" | grep -E "ceiling|back to back"
      grep -E "gemvmma" "$OUT/bench.log" ;;
  esac
done
echo "total: $(( $(date +%s) - t0 )) s"
