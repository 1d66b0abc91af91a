#!/bin/bash
# The tensor-core GEMV for decode batches 2..64 (src/backend/cuda/linear_mma.cu) on the GPU
# machine, from the repository root, `.devcarry/cuda` carried: builds the parity tests,
# llama_bench and offline_bench, then
#   1. parity: the mma kernel's cases (CudaParity.LinearMma, CudaFusedParity.LinearSiluMulMma) and
#      the GEMV/linear suites around it (PARITY_OPS), then the model suites (PARITY_MODELS: batch
#      decode through the real forward), each in its own process, logs in $OUT;
#   2. llama_bench --what ceilings,gemv: the batch-1 GEMV variants, then per 8B linear and
#      m = 1..64 the mma kernel vs the FMA GEMV vs cuBLAS, and one decode step's linears per m;
#   3. the offline engine (8B shape, 512 in / 256 out) at BATCHES (default 1 8 16 32 64) with the
#      mma kernel (STRATA_GEMV_MMA=1; it is off by default), and at OFF_BATCHES (default 8 32 64)
#      with the defaults to compare.
# Stages can be skipped: STAGES="parity bench offline" (default all three).
set -u
source bench/cuda/device_env.sh  # OUT, C, PKG, dev_configure, dev_build; carried deps unpacked
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
t0=$(date +%s)
dev_configure
dev_build strata_parity_test strata_bench_llama_bench strata_bench_offline_bench
echo "build: $(( $(date +%s) - t0 )) s"
OPS=${PARITY_OPS:-'CudaParity.LinearMma:CudaFusedParity.LinearSiluMulMma:CudaParity.Linear:CudaParity.LinearSplitK:CudaFusedParity.LinearSiluMul:CudaParity.PerHeadLinear'}
MODELS=${PARITY_MODELS:-'Fixtures/CudaModel.*:CudaModelGreedy.*'}
OB="./build-dev/strata_bench_offline_bench --config $C/shared/configs/llama-3.1-8b/config.json --tokenizer $C/shared/models/house-llama --in 512 --out 256 --breakdown-batch 0"
for stage in ${STAGES:-parity bench offline}; do
  case $stage in
    parity)
      t1=$(date +%s)
      ./build-dev/strata_parity_test --gtest_filter="$OPS" >"$OUT/parity_ops.log" 2>&1
      echo "parity ops: rc $? ($(( $(date +%s) - t1 )) s)"
      grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|^\[       OK|DIFFER|Failure" "$OUT/parity_ops.log" | head -40
      grep -E "linear mma (warps/SM 24 m=(8|32|64) k=264|m=(8|32) k=14336)|linear_silu_mul mma m=(2|32|64) k=4104" \
        "$OUT/parity_ops.log" | head -12
      t1=$(date +%s)
      ./build-dev/strata_parity_test --gtest_filter="$MODELS" >"$OUT/parity_models.log" 2>&1
      echo "parity models: rc $? ($(( $(date +%s) - t1 )) s)"
      grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|^\[       OK|Failure" "$OUT/parity_models.log" | head -30 ;;
    bench)
      t1=$(date +%s)
      ./build-dev/strata_bench_llama_bench --what ceilings,gemv >"$OUT/bench.log" 2>&1
      echo "bench: rc $? ($(( $(date +%s) - t1 )) s)"
      grep -E "ceiling|gemv " "$OUT/bench.log" | grep -E "ceiling|back to back"
      grep -E "gemvmma" "$OUT/bench.log" ;;
    offline)
      for bs in ${BATCHES:-1 8 16 32 64}; do
        STRATA_GEMV_MMA=1 $OB --prompts $bs >"$OUT/offline_b$bs.log" 2>&1
        echo "batch $bs, mma on (rc $?):"
        grep -E "^offline|engine steps" "$OUT/offline_b$bs.log" | sed 's/^/  /'
      done
      for bs in ${OFF_BATCHES:-8 32 64}; do
        $OB --prompts $bs >"$OUT/offline_b${bs}_off.log" 2>&1
        echo "batch $bs, mma off (rc $?):"
        grep -E "^offline|engine steps" "$OUT/offline_b${bs}_off.log" | sed 's/^/  /'
      done ;;
  esac
done
echo "total: $(( $(date +%s) - t0 )) s"
