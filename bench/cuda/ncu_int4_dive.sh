#!/bin/bash
# Why the W4A16 register GEMV stops at ~40-57% of copy bandwidth (issue 21): Nsight Compute's
# sections (speed of light, memory workload, occupancy, warp stall reasons, scheduler) for the
# first launches of int4_gemv_reg_kernel in strata_bench_int4_linear_bench --what gemv --m 1
# (the 8B shapes, group 128). Run from the repository root on the GPU machine, `.devcarry/cuda`
# carried; expects build-dev to exist or builds the bench. Then the same sections for the MoE
# INT4 expert GEMV (moe_gemv) of one Kimi-K2.5 rank at T = 1 and 128 tokens (issue 23).
# Logs: $OUT/ncu_int4.txt, $OUT/ncu_moe_t1.txt, $OUT/ncu_moe_t128.txt.
# Usage: bash bench/cuda/ncu_int4_dive.sh   (NCU_LAUNCHES=N, NCU_KERNEL=regex override)
set -u
source bench/cuda/device_env.sh
dev_configure
dev_build strata_bench_int4_linear_bench strata_bench_moe_bench
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
if [ -z "$NCU" ]; then echo "ncu: not found"; exit 0; fi
t0=$(date +%s)
timeout 200 "$NCU" --clock-control none --kernel-name "regex:${NCU_KERNEL:-int4_gemv_reg}" \
  --launch-count "${NCU_LAUNCHES:-6}" \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
  --section WarpStateStats --section SchedulerStats --section LaunchStats \
  --section MemoryWorkloadAnalysis_Tables \
  ./build-dev/strata_bench_int4_linear_bench --what gemv --m 1 >"$OUT/ncu_int4.txt" 2>&1
echo "ncu int4: rc $? ($(( $(date +%s) - t0 )) s)"
grep -E "int4_gemv_reg|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Grid Size|Block Size|Stall|Warp Cycles Per Issued|Issued Warp Per|No Eligible|L2 Hit|Mem Busy|Max Bandwidth" "$OUT/ncu_int4.txt" | head -150
SECTIONS="--section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats --section SchedulerStats --section LaunchStats"
for t in 1 128; do
  t0=$(date +%s)
  timeout 90 "$NCU" --clock-control none -k regex:moe_gemv --launch-count 2 $SECTIONS \
    ./build-dev/strata_bench_moe_bench --what kernels --configs kimi --tokens $t --sweep 0 --calls 1 \
    --reps 1 >"$OUT/ncu_moe_t$t.txt" 2>&1
  echo "ncu moe T=$t: rc $? ($(( $(date +%s) - t0 )) s)"
  grep -E "moe_gemv|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Grid Size|Stall|Warp Cycles Per Issued|Issued Warp Per|No Eligible|L2 Hit|Mem Busy|Max Bandwidth" "$OUT/ncu_moe_t$t.txt" | head -60
done
