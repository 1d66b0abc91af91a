#!/bin/bash
# The EAGLE-3 drafter's forward on the GPU (issue 26; arch/eagle3.cc) against the PyTorch reference
# tools/eagle3_train.py wrote for the committed house-llama drafter
# (tests/parity/eagle3_parity_test.cc: bf16 bounds), plus the CPU model parity of house-llama as a
# control. From the repository root on the GPU machine, .devcarry/cuda carried. Under 2 minutes
# after the build; logs in $OUT.
set -u
source bench/cuda/device_env.sh  # OUT, C, PKG, dev_configure, dev_build
t0=$(date +%s)
dev_configure
dev_build strata_parity_test
echo "build: $(( $(date +%s) - t0 )) s"
t1=$(date +%s)
timeout 120 ./build-dev/strata_parity_test --gtest_filter='CudaEagle3.*' >"$OUT/parity.log" 2>&1
echo "parity CudaEagle3: rc $? ($(( $(date +%s) - t1 )) s)"
grep -E "eagle3 cuda|OK|FAILED|PASSED|Failure|Expected|Which is" "$OUT/parity.log" | tail -20
echo "total: $(( $(date +%s) - t0 )) s"
