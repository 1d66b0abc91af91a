#!/bin/bash
# Batch-1 decode work (issue 6) on the GPU machine, from the repository root, `.devcarry/cuda`
# carried: builds the parity tests and llama_bench only, then
#   1. the parity suites of the ops this work touches (PARITY_OPS) and the model suites
#      (PARITY_MODELS), each in its own process, logs in $OUT (no pipe that can cut the output);
#   2. llama_bench --what ${BENCH_WHAT:-ceilings,gemv,decode} (decode: every launch variant, see
#      bench_decode; DECODE_MODES picks some);
#   3. the per-op profile of a decode step (4 layers of the 8B shape), unfused and fused.
# Stages can be skipped: STAGES="parity bench profile" (default all three).
set -u
source bench/cuda/device_env.sh  # OUT, C, PKG, dev_configure, dev_build; carried deps unpacked
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
t0=$(date +%s)
dev_configure
dev_build strata_parity_test strata_bench_llama_bench
echo "build: $(( $(date +%s) - t0 )) s"
OPS=${PARITY_OPS:-'CudaFusedParity.*:CudaParity.Linear:CudaParity.RmsNormAndResidual:CudaParity.AddSiluMul:CudaParity.RopeVariants:CudaParity.CopiesEmbeddingGather:CudaParity.DecodeAttention:KvFp8.KvWriteStoresTheCpuBytes:KvFp8.DecodeAttention:KvFp8.HouseLlamaMatchesCpuBackend'}
MODELS=${PARITY_MODELS:-'Fixtures/CudaModel.*:CudaModelGreedy.*:CudaModelLong.*'}
for stage in ${STAGES:-parity bench profile}; do
  case $stage in
    parity)
      t1=$(date +%s)
      ./build-dev/strata_parity_test --gtest_filter="$OPS" >"$OUT/parity_ops.log" 2>&1
      echo "parity ops: rc $? ($(( $(date +%s) - t1 )) s)"
      grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|DIFFER|Failure" "$OUT/parity_ops.log" | head -40
      grep -E "linear_silu_mul m=1 k=4096|qkv_rope_kv_write 32/8.*early 1|HouseLlama|agreement" "$OUT/parity_ops.log" | head -12
      t1=$(date +%s)
      ./build-dev/strata_parity_test --gtest_filter="$MODELS" >"$OUT/parity_models.log" 2>&1
      echo "parity models: rc $? ($(( $(date +%s) - t1 )) s)"
      grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|^\[       OK|Failure|greedy tokens equal" "$OUT/parity_models.log" | head -40 ;;
    bench)
      ./build-dev/strata_bench_llama_bench --what ${BENCH_WHAT:-ceilings,gemv,decode} >"$OUT/bench.log" 2>&1
      echo "bench: rc $?"
      grep -E "ceiling|gemv|decode|model|graphs" "$OUT/bench.log" ;;
    profile)
      ./build-dev/strata_bench_llama_bench --what profile --steps 16 \
        --config $C/shared/configs/llama-3.1-8b-4layers/config.json >"$OUT/profile.log" 2>&1
      echo "profile: rc $?"
      grep -E "profile" "$OUT/profile.log" ;;
  esac
done
