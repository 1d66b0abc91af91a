#!/bin/bash
# The MLA decode kernel's bandwidth pass (issue 22: rows copied in groups of 4, L2 prefetch) on the
# GPU machine (the device tool), from the repository root, unattended, < 4 minutes:
#   1. builds strata_parity_test and strata_bench_mla_bench (Release, build-dev);
#   2. the MLA parity tests against the CPU twin (MlaAttention.*: every row format and kernel, the
#      decode kernel's two stage layouts and prefetch distances); their verdict decides how the
#      benchmark's numbers may be read (printed before them);
#   3. the ceilings (copy bandwidth, bf16 GEMM rate), the old-vs-new sweep of the decode kernel
#      (`--what variants`: old = one row a copy and no prefetch, new = the product's default) with
#      one summary line a layout and head count, then issue 22's decode rows with the product's
#      plans (`--what acceptance`: bf16 and fp8_flashmla at 16, 8, 128 heads), each its own process
#      (a fault in one leaves the other);
#   4. the PyTorch baseline of the same decode (bench/cuda/mla_torch_baseline.py).
# Logs go to $OUT (mla_decode_parity.log, mla_decode_variants.log, mla_decode_accept.log,
# mla_decode_torch.log). Carry: .devcarry/cuda, as the other bench/cuda scripts.
# Knobs: PARITY_FILTER (default MlaAttention.*), BUILD=0 (reuse build-dev), TORCH=0.
set -u
source bench/cuda/device_env.sh  # OUT, C, P, PKG; carried deps unpacked
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.limit --format=csv,noheader
t0=$(date +%s)
if [ "${BUILD:-1}" = 1 ]; then
  dev_configure
  dev_build strata_parity_test strata_bench_mla_bench
fi
echo "build: $(( $(date +%s) - t0 )) s"

timeout 150 ./build-dev/strata_parity_test --gtest_filter="${PARITY_FILTER:-MlaAttention.*}" \
  >"$OUT/mla_decode_parity.log" 2>&1
rc=$?
grep -E "^\[ *(OK|FAILED|PASSED) *\]|Failure|Expected|Which is|kernel " "$OUT/mla_decode_parity.log" |
  grep -v "nmse [0-9.e-]*$" | tail -60
echo "decode kernel lines over the 1e-4 bound (nmse):"
grep "decode " "$OUT/mla_decode_parity.log" | awk '{ if ($NF + 0 >= 1e-4 || $NF == "inf" || $NF == "nan") print }' | head -20
fails=$(grep -c "^\[  FAILED  \] MlaAttention" "$OUT/mla_decode_parity.log")
echo "parity: exit status $rc, $fails failed test(s), $(( $(date +%s) - t0 )) s"
if [ $rc = 124 ]; then
  echo "PARITY TIMED OUT (a hang: most likely a stage whose copies do not match its expected bytes)"
elif [ $rc != 0 ]; then
  echo "PARITY FAILED: the benchmark below still runs, but a variant whose cases failed times wrong"
  echo "results (groups: DecodeRowGroups and every page-16/64 case; prefetch: DecodeL2Prefetch)"
fi

B=./build-dev/strata_bench_mla_bench
timeout 120 $B --what ceilings,variants 2>&1 | tee "$OUT/mla_decode_variants.log" | grep -E "^(device|ceil|copy|gemm|summary)|old |new "
echo "variants: exit status ${PIPESTATUS[0]}, $(( $(date +%s) - t0 )) s"
timeout 60 $B --what ceilings,acceptance 2>&1 | tee "$OUT/mla_decode_accept.log" | grep -v "^$"
echo "acceptance: exit status ${PIPESTATUS[0]}, $(( $(date +%s) - t0 )) s"
[ "${TORCH:-1}" = 1 ] && timeout 60 python3 bench/cuda/mla_torch_baseline.py 2>&1 | tee "$OUT/mla_decode_torch.log"

echo "==== old -> new (the decode kernel, batch 64 x 4,096, % of copy bandwidth) ===="
grep "^summary" "$OUT/mla_decode_variants.log"
echo "parity: exit status $rc ($fails failed)"
echo "total: $(( $(date +%s) - t0 )) s"
