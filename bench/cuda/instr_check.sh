#!/bin/bash
# What the decode GEMVs spend a weight tile on (issues 21, 23), one build, on the GPU machine from
# the repository root (carry STRATA_CARRY=$PWD/.devcarry/bench: debs and shared/configs). Session 16
# found the FP8 MoE GEMV and the INT4 register GEMV issue-bound (143 and 118 warp instructions a
# 512-byte tile, against the bf16 MoE GEMV's 51): count before timing.
#   1. ncu, one launch each of: the MoE decode GEMV at T = 8 for DeepSeek-V3's FP8 rank and
#      Moonlight's bf16 experts (moe_bench --what kernels), the INT4 experts of one Kimi-K2.5 rank at
#      T = INSTR_KIMI_TOKENS (default 1; moe_bench --what backend), the dense W4A16 register GEMV on
#      the 8B shapes (int4_linear_bench --what gemv); warp instructions, DRAM bytes, issue and warp
#      occupancy, the warp-state section; ncu_per_tile.py prints instructions a 512-byte tile.
#   2. The SASS loops of the register GEMV and the MoE GEMV (sass_loops.py): instructions a loop
#      trip by opcode family.
# Logs and dumps under $OUT; the tables on stdout.
set -u
source bench/cuda/device_env.sh
t0=$(date +%s)
dev_configure
dev_build strata_bench_moe_bench strata_bench_int4_linear_bench
echo "build: $(( $(date +%s) - t0 )) s"
M=smsp__inst_executed.sum,dram__bytes_read.sum,gpu__time_duration.sum
M=$M,sm__issue_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active
M=$M,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active
M=$M,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active
prof() {  # NAME KERNEL-REGEX LAUNCHES COMMAND...
  local name=$1 re=$2 n=$3
  shift 3
  timeout 200 ncu --clock-control none -k "regex:$re" --launch-count "$n" --section WarpStateStats \
    --metrics "$M" "$@" >"$OUT/ncu_$name.log" 2>&1
  echo "ncu $name: exit $?"
}
prof fp8 moe_gemv_kernel 2 ./build-dev/strata_bench_moe_bench --what kernels --configs dsv3 \
  --tokens 8 --sweep 0 --calls 1 --reps 1
prof bf16 moe_gemv_kernel 2 ./build-dev/strata_bench_moe_bench --what kernels --configs moonlight \
  --tokens 8 --sweep 0 --calls 1 --reps 1
prof kimi 'int4_split_gate_up|int4_flat_down|int4_gemv_reg' 3 ./build-dev/strata_bench_moe_bench \
  --what backend --backend-configs kimi --tokens "${INSTR_KIMI_TOKENS:-1}" --calls 1 --reps 1
prof w4a16 int4_gemv_reg_kernel 4 ./build-dev/strata_bench_int4_linear_bench --what gemv
python3 bench/cuda/ncu_per_tile.py "$OUT"/ncu_fp8.log "$OUT"/ncu_bf16.log "$OUT"/ncu_kimi.log \
  "$OUT"/ncu_w4a16.log
D=build-dev/CMakeFiles/strata_backend.dir/src/backend/cuda
cuobjdump -sass $D/linear_int4_reg.cu.o >"$OUT/int4_reg.sass"
cuobjdump -sass $D/moe_experts_gemv.cu.o >"$OUT/moe_gemv.sass"
python3 bench/cuda/sass_loops.py "$OUT/int4_reg.sass" --kernel 'int4_gemv_reg_kernelILi16ELi2ELb0' \
  --kernel 'int4_gemv_reg_kernelILi8ELi0ELb1' | cut -c1-240
python3 bench/cuda/sass_loops.py "$OUT/moe_gemv.sass" --kernel 'moe_gemv_kernelILi1ELi1ELb1' \
  --kernel 'moe_gemv_kernelILi0ELi1ELb1' | cut -c1-240
gzip -f "$OUT"/*.sass  # the dumps are tens of MB: compressed to come back
echo "total: $(( $(date +%s) - t0 )) s"
