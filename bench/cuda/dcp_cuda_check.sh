#!/bin/bash
# Decode context parallelism's CUDA ops (issue 27) on the one-GPU machine, from the repository
# root. The N ranks of a DCP group are simulated on the one device (tests/parity/
# mla_dcp_parity_test.cc): N = 2, 4, 8, bf16 and the fp8 latent layouts, decode and prefill.
# Stages (STAGES, default "dcp mla"; the build always runs first):
#   dcp  MlaDcp.*: each simulated rank's CUDA partial (output + log-sum-exp over its shard)
#        against the CPU backend's, the merge kernel against the CPU's merge, and the CUDA merge
#        of the N partials against full (non-DCP) CUDA and CPU attention over all tokens;
#   mla  the MLA suites the change touches (the kernels' key limit, partial stores and merge):
#        MlaAttention.* (the kernels on raw buffers, every layout, splits, graphs) and
#        MlaBackend.* (CudaBackend::mla_attention vs the CPU): --dcp-size 1 must be unchanged.
# PARITY_FILTER replaces both stages' filters with one. Needs only the usual carry
# (.devcarry/cuda, device_env.sh); no model. Logs: $OUT/logs.tgz, a summary on stdout.
set -u
FINAL_OUT=${OUT:-/tmp/strata_out}
mkdir -p "$FINAL_OUT"
W=/tmp/dcp_cuda_check
rm -rf "$W" && mkdir -p "$W"
export OUT=$W
source bench/cuda/device_env.sh  # C, PKG, dev_configure, dev_build
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t0=$(date +%s)
dev_configure
dev_build strata_parity_test
echo "build: $(($(date +%s) - t0)) s"

# parity NAME FILTER [LINES]: one run of the parity binary, its verdicts and failures, then the
# lines matching LINES (the measured errors).
parity() {
  local t1=$(date +%s)
  timeout 150 ./build-dev/strata_parity_test --gtest_filter="$2" >"$W/$1.log" 2>&1
  echo "$1: exit $?, $(($(date +%s) - t1)) s"
  grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure|CHECK|Expected|Which is" "$W/$1.log" | head -60
  [ -n "${3:-}" ] && grep -E "$3" "$W/$1.log" | head -160
}

if [ -n "${PARITY_FILTER:-}" ]; then
  parity filter "$PARITY_FILTER" "mla dcp"
else
  for stage in ${STAGES:-dcp mla}; do
    case $stage in
      dcp) parity dcp "MlaDcp.*" "mla dcp" ;;
      mla) parity mla "MlaAttention.*:MlaBackend.*" ;;
    esac
  done
fi
tar czf "$FINAL_OUT/logs.tgz" -C "$W" .
echo "total: $(($(date +%s) - t0)) s"
