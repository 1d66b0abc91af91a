#!/bin/bash
# Tensor-parallel check on a multi-GPU device kind (e.g. nvidia-h200-x2), from the repository root:
# builds strata_parity_test, runs the NCCL communicator and tp-vs-tp-1 logits suites, then the
# single-GPU model suite on its own. Logs go to $OUT. Carry: .devcarry/cuda (debs/ and shared/).
set -u
source bench/cuda/device_env.sh
nvidia-smi -L
t0=$(date +%s)
cmake -S . -B build-dev -G Ninja -DSTRATA_CUDA=ON -DCMAKE_BUILD_TYPE=Release -DSTRATA_SHARED_DIR=$C/shared $PKG >"$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
grep -i nccl "$OUT/cmake.log" | head -3
cmake --build build-dev -j32 --target strata_parity_test >"$OUT/build.log" 2>&1 || { grep -B3 -A12 -E "error|Error" "$OUT/build.log" | head -60; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
export NCCL_NVLS_ENABLE=0
timeout 120 ./build-dev/strata_parity_test --gtest_filter='NcclComm.*:TpParity.*' 2>&1 | tee "$OUT/tp.log" | grep -vE "^\[ *(RUN|OK) " | tail -40
echo "tp: $(( $(date +%s) - t0 )) s"
timeout 45 ./build-dev/strata_parity_test --gtest_filter='Fixtures/CudaModel.*' 2>&1 | tee "$OUT/cudamodel.log" | tail -8; echo "rc=${PIPESTATUS[0]}"
