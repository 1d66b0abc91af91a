#!/bin/bash
# The MoE experts' prefill regime (issue 23: >= 50% of the bf16 GEMM rate at 8,192 tokens in every
# format), one build, on the GPU machine from the repository root (carry
# STRATA_CARRY=$PWD/.devcarry/cuda for the parity fixtures). In order:
#   1. parity (PARITY_FILTER, default the MoE kernel suites; "-" skips)
#   2. the layer's kernels at PREFILL_TOKENS (default 512,8192) for PREFILL_CONFIGS (default
#      dsv3,moonlight,moonlight-int4,kimi): gate_up and down apart, TFLOP/s and % of the cuBLAS
#      bf16 rate measured in the same run (moe_bench --what kernels), the down projection's blocks
#      a CTA swept; EXTRA_KERNELS: one more kernels pass at 8,192 tokens with these flags (e.g.
#      "--configs dsv3,kimi --producer-warp 1": the producer-warp GEMM beside the product's);
#      PREFILL_VARIANTS (tunable_variants.h names) run the same through the backend
#   3. (NCU=0 skips it) Nsight Compute on the two prefill GEMMs (gate_up, down) of each config at
#      NCU_TOKENS (default 8192): speed of light, tensor pipe, L2, warp stalls by reason, occupancy
#      (NCU_KERNEL: the kernel regex, default moe_gemm; NCU_CONFIGS: default "dsv3 moonlight kimi")
# Logs under $OUT/moe_prefill; the tables on stdout.
set -u
source bench/cuda/device_env.sh
t0=$(date +%s)
dev_configure
dev_build strata_parity_test strata_bench_moe_bench
echo "build: $(( $(date +%s) - t0 )) s"
L=$OUT/moe_prefill
mkdir -p "$L"
F=${PARITY_FILTER:-MoeParity.*:MoeFp8F16.*:MoeGemmShapes.*:MoeBackend.*}
[ "$F" = "-" ] || dev_parity moe "$F" 300
CONFIGS=${PREFILL_CONFIGS:-dsv3,moonlight,moonlight-int4,kimi}
timeout 300 ./build-dev/strata_bench_moe_bench --what kernels --configs "$CONFIGS" \
  --tokens "${PREFILL_TOKENS:-512,8192}" --sweep-max-tokens 0 >"$L/kernels.log" 2>&1
echo "kernels: exit $?"
grep -E "^ceiling|experts prefill|layer|down blocks" "$L/kernels.log" | cut -c1-260 | head -60
if [ -n "${EXTRA_KERNELS:-}" ]; then  # a second kernels pass, e.g. "--configs kimi --tile-rows 128"
  timeout 200 ./build-dev/strata_bench_moe_bench --what kernels --tokens 8192 --sweep 0 \
    $EXTRA_KERNELS >"$L/kernels_extra.log" 2>&1
  echo "extra kernels ($EXTRA_KERNELS): exit $?"
  grep -E "experts prefill|producer warp" "$L/kernels_extra.log" | cut -c1-260
fi
if [ -n "${PREFILL_VARIANTS:-}" ]; then
  timeout 300 ./build-dev/strata_bench_moe_bench --what backend --backend-configs dsv3,moonlight,kimi \
    --tokens "${PREFILL_TOKENS:-512,8192}" --variants "$PREFILL_VARIANTS" >"$L/variants.log" 2>&1
  echo "variants: exit $?"
  grep -E "^ceiling  D2D|^backend|^variant" "$L/variants.log" | cut -c1-240
fi
[ "${NCU:-1}" = 1 ] || { echo "total: $(( $(date +%s) - t0 )) s"; exit 0; }
S="--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis"
S="$S --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats"
# The stall reasons (warps stalled a cycle per issued instruction, by reason): the sections alone
# print none without source counters.
S="$S --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
for c in ${NCU_CONFIGS:-dsv3 moonlight kimi}; do
  timeout 200 ncu --clock-control none -k regex:${NCU_KERNEL:-moe_gemm} --launch-count 2 $S \
    ./build-dev/strata_bench_moe_bench --what kernels --configs "$c" --tokens "${NCU_TOKENS:-8192}" \
    --sweep 0 --calls 1 --reps 1 >"$L/ncu_$c.log" 2>&1
  echo "ncu $c: exit $?"
  # the stall reasons above 0.2 cycles an instruction, then the sections' lines
  awk '/moe_gemm/ {print "  " $0} /issue_stalled_/ && $NF + 0 > 0.2 {sub(/smsp__average_warps_issue_stalled_/, "stall "); print "    " $1, $2, $NF}' \
    "$L/ncu_$c.log" | cut -c1-160
  grep -E "moe_gemm|Duration|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput|DRAM Throughput|Executed Ipc A|Issue Slots Busy|Achieved Occupancy|Registers Per|Grid Size|Warp Cycles Per Issued|No Eligible|Stall|Tensor|L1/TEX Hit|L2 Hit|Local" \
    "$L/ncu_$c.log" | cut -c1-200 | head -80
done
echo "total: $(( $(date +%s) - t0 )) s"
