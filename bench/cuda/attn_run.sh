#!/bin/bash
# Attention-kernel iteration on the GPU machine (the device tool), from the repository root:
# builds only the parity tests and llama_bench, then runs the attention parity suites (the
# product's, then the development variants' of bench/cuda/dev: DEV_PARITY=0 skips them), the
# attention benchmark (with its ceilings; it compares the variants), the PyTorch SDPA reference
# and, with NCU=1, an Nsight Compute profile of attention launches (NCU_SPECS). BENCH=0 / SDPA=0
# skip those stages. Logs go to $OUT.
# Carry: .devcarry/cuda (debs/ and shared/). Env: PARITY_FILTER (default: the attention suites).
set -u
source bench/cuda/device_env.sh  # OUT, C, P, PKG; carried deps unpacked
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
t0=$(date +%s)
dev_configure
dev_build strata_parity_test strata_dev_parity_test strata_bench_llama_bench
echo "build: $(( $(date +%s) - t0 )) s"
timeout 150 ./build-dev/strata_parity_test \
  --gtest_filter=${PARITY_FILTER:-CudaParity.*Attention*:KvFp8.*Attention*} >"$OUT/parity.log" 2>&1
echo "parity: exit status $?"
grep -E "nmse|OK|FAILED|PASSED|Failure|error|Expected|Which is|actual" "$OUT/parity.log" | tail -80
if [ "${DEV_PARITY:-1}" = 1 ]; then
  timeout 150 ./build-dev/strata_dev_parity_test --gtest_filter='DevParity.PrefillAttention*' \
    >"$OUT/parity_dev.log" 2>&1
  echo "parity dev: exit status $?"
  grep -E "prefill kernel|OK|FAILED|PASSED|Failure" "$OUT/parity_dev.log" | tail -20
fi
echo "parity: $(( $(date +%s) - t0 )) s"
[ "${BENCH:-1}" = 1 ] &&
  timeout 150 ./build-dev/strata_bench_llama_bench --what ${BENCH_WHAT:-attention} 2>&1 | tee "$OUT/bench.log"
if [ "${CALLS1:-0}" = 1 ]; then  # decode timed one call per region (host work included)
  ATTN_CALLS=1 timeout 60 ./build-dev/strata_bench_llama_bench --what attention-decode 2>&1 | grep "attn     decode" | sed 's/^/calls=1 /'
fi
echo "bench: $(( $(date +%s) - t0 )) s"
[ "${SDPA:-1}" = 1 ] && python3 bench/cuda/sdpa_bench.py 2>&1 | tee "$OUT/sdpa.log"
if [ "${NCU:-0}" = 1 ]; then
  # NCU_SPECS: "kernel-regex:launches-to-skip ..." (attention-ncu mode runs 12 launches of each
  # of: decode, prefill wgmma128, prefill wgmma128s3, prefill mma); one profiled launch each.
  for spec in ${NCU_SPECS:-decode_kernel:2 wgmma_prefill_kernel:2 wgmma_prefill_kernel:14}; do
    k=${spec%%:*}; skip=${spec##*:}
    timeout 120 ncu --clock-control none -k regex:"$k" --launch-skip $skip --launch-count 1 \
      --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats \
      --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section SchedulerStats \
      --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio,regex:sm__pipe_tensor.*cycles_active.avg.pct_of_peak_sustained_active,regex:sm__inst_executed_pipe_tensor.*sum" \
      ./build-dev/strata_bench_llama_bench --what attention-ncu > "$OUT/ncu_${k}_$skip.log" 2>&1
    grep -E "prefill_kernel|decode_kernel|Duration|Compute \(SM\)|Issued Ipc|Registers Per|Achieved Occ|L2 Cache Thr|DRAM Thr|tensor|stalled" "$OUT/ncu_${k}_$skip.log" |
      awk '$NF+0 > 0.05 || /kernel|Duration|Compute|Ipc|Registers|Occ|Thr/' | head -45
  done
fi
echo "total: $(( $(date +%s) - t0 )) s"
