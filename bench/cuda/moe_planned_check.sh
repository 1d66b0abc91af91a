#!/bin/bash
# The INT4 experts' register-GEMV modes on one Kimi-K2.5 rank of tp 8 and the Moonlight shape
# (issues 23, 24: W4A16 MoE decode >= 75% of copy bandwidth at <= 32 tokens; the Kimi rank's
# batch-128 step), on the GPU machine from the repository root (any carry with debs and
# shared/configs; STRATA_CARRY=$PWD/.devcarry/bench is the slimmest):
#   (1) parity of the MoE ops (MoE_PARITY=0 skips it);
#   (2) one MoE layer through the backend (moe_bench --what backend): experts' share of copy
#       bandwidth at each token count, by default and under each MOE_VARIANTS tunable change
#       (tunable_variants.h: rounding, blocks per work item, plan tile rows);
#   (3) Nsight Compute on the experts' kernels of the Kimi layer at NCU_TOKENS tokens: duration,
#       DRAM throughput, issue activity and warp stall reasons (NCU=0 skips it);
#   (4) the Kimi rank's decode step on 2- and 4-layer cuts projected to 61 layers, by default and
#       under each KIMI_VARIANTS change (KIMI=0 skips it).
# Logs packed into $OUT/moe_planned_check.tgz; the summary on stdout.
set -u
source bench/cuda/device_env.sh
t0=$(date +%s)
dev_configure
dev_build strata_bench_moe_bench strata_bench_rank_step_bench
[ "${MOE_PARITY:-1}" = 1 ] && dev_build strata_parity_test
echo "build: $(( $(date +%s) - t0 )) s"
L=$OUT/moe_planned_check
mkdir -p $L
pack() { tar czf "$OUT/moe_planned_check.tgz" -C "$OUT" moe_planned_check && rm -rf "$L"; }
trap pack EXIT
if [ "${MOE_PARITY:-1}" = 1 ]; then
  timeout 200 ./build-dev/strata_parity_test --gtest_filter='MoeParity.*:MoeBackend.*:Int4Parity.*' \
    >"$L/parity.log" 2>&1
  echo "parity: exit $?; $(grep -E '^\[  (PASSED|FAILED)  \]' "$L/parity.log" | tr '\n' ' ')"
  grep -E "^\[  FAILED  \]" "$L/parity.log" | head -8
fi
V=${MOE_VARIANTS:-moe_unrounded,moe_split2,moe_split4,moe_rows8,moe_grouped}
timeout 400 ./build-dev/strata_bench_moe_bench --what backend --backend-configs ${MOE_CONFIGS:-kimi,moonlight} \
  --tokens ${MOE_TOKENS:-1,8,32,128,512} --variants "$V" >"$L/moe_backend.log" 2>&1
echo "moe_bench backend: exit $?"
grep -E "^ceiling|^copy|^gemm|^backend|^variant" "$L/moe_backend.log" | cut -c1-230
NCU=${NCU_BIN:-$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)}
if [ "${NCU:-0}" != 0 ] && [ -n "$NCU" ]; then
  for t in ${NCU_TOKENS:-1 128}; do
    timeout 200 "$NCU" --clock-control none -k regex:int4_gemv_reg --launch-skip 4 --launch-count 4 \
      --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats \
      --section LaunchStats --section MemoryWorkloadAnalysis \
      ./build-dev/strata_bench_moe_bench --what backend --backend-configs kimi --tokens $t --calls 1 \
      --reps 1 >"$L/ncu_t$t.txt" 2>&1
    echo "ncu T=$t: exit $?"
    grep -E "int4_gemv_reg_kernel|Duration|DRAM Throughput|Achieved Occupancy|Registers Per|Grid Size|Issued Warp Per|No Eligible|Warp Cycles Per Issued|Stall" "$L/ncu_t$t.txt" | cut -c1-150 | head -60
  done
fi
if [ "${KIMI:-1}" = 1 ]; then
  W=/tmp/moe_planned_check
  for n in 2 4; do
    python3 bench/cuda/rank_cuts.py cut "$C/shared/configs/kimi-k2.5/config.json" $n "$W/kimi$n"
    timeout 240 ./build-dev/strata_bench_rank_step_bench --config "$W/kimi$n/config.json" --tp-size 8 \
      --batches ${KIMI_BATCHES:-1,32,128} --context 4096 --prefill 0 --reps 10 \
      --variants ${KIMI_VARIANTS:-moe_unrounded,moe_split2,moe_rows8} >"$L/kimi$n.log" 2>&1
    echo "kimi $n layers: exit $?"
  done
  python3 bench/cuda/rank_cuts.py project "$L/kimi2.log" "$L/kimi4.log"
fi
echo "total: $(( $(date +%s) - t0 )) s"
