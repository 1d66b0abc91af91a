#!/bin/bash
# The INT4 decode GEMVs (issues 21, 23): a Kimi-K2.5 rank's experts and the dense W4A16 GEMV, one
# build, on the GPU machine from the repository root (carry STRATA_CARRY=$PWD/.devcarry/fx or
# .devcarry/bench). Stages (MOE_PROFILE_STAGES, default "timing ncu"):
#   parity  the register GEMV's and the INT4 experts' parity suites (PARITY_FILTER overrides);
#   timing  moe_bench --what backend at 1, 8, 32, 128 tokens (the experts' time and % of copy),
#           with MOE_PROFILE_VARIANTS (tunable_variants.h names) beside the defaults;
#   ncu     one backend call at each of MOE_PROFILE_TOKENS (default 32 128): every kernel of the
#           experts (gpu time, DRAM bytes and throughput, warp instructions, issue / warp
#           occupancy); ncu_per_tile.py prints instructions a 512-byte tile;
#   stalls  warp stall reasons an issued instruction of the experts' kernels at STALL_TOKENS
#           (default 128: the planned gate_up and the flat down);
#   sass    the SASS of the register GEMV's group-32 round-mode kernel and of the flat down
#           (sass_loops.py tables; the two kernels' dumps gzipped under $OUT);
#   dense   int4_linear_bench --what ceilings,gemv: the 8B shapes' sweep and one decode token's
#           128 GEMVs per knob set (the backend's defaults, rows 4, rounded).
# ncu and stalls also profile MOE_PROFILE_VARIANTS' kernels (the backend runs each variant).
# Logs under $OUT; tables on stdout.
set -u
source bench/cuda/device_env.sh
t0=$(date +%s)
[ -d build-dev ] || dev_configure
dev_build strata_bench_moe_bench strata_bench_int4_linear_bench strata_parity_test
echo "build: $(( $(date +%s) - t0 )) s"
B=./build-dev/strata_bench_moe_bench
V=${MOE_PROFILE_VARIANTS:-}
STAGES=" ${MOE_PROFILE_STAGES:-timing ncu} "
if [[ $STAGES == *" parity "* ]]; then
  L=$OUT
  dev_parity int4 "${PARITY_FILTER:-Int4Parity.GemvReg*:MoeBackend.*:MoeParity.*}" 900
fi
if [[ $STAGES == *" timing "* ]]; then
  $B --what backend --backend-configs kimi --tokens 1,8,32,128 ${V:+--variants $V} \
    >"$OUT/backend.log" 2>&1
  echo "backend: exit $?"
  grep -E "copy|experts|variant|T =|tokens" "$OUT/backend.log" | head -60
fi
# NCU_KERNELS / NCU_NAME_BASE pick other kernels: e.g. NCU_NAME_BASE=mangled
# NCU_KERNELS='regex:int4_gemv_reg_kernelILi8ELi0ELb1ELi4E' is the register GEMV with four row
# tiles a position, round mode, group 32 (the demangled names carry no template arguments).
KERNELS=${NCU_KERNELS:-'regex:int4_gemv|int4_flat|int4_split|int4_down|moe_plan|moe_combine'}
NB="--kernel-name-base ${NCU_NAME_BASE:-function}"
if [[ $STAGES == *" ncu "* ]]; then
  M=smsp__inst_executed.sum,dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum
  M=$M,sm__issue_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active
  M=$M,dram__throughput.avg.pct_of_peak_sustained_elapsed,launch__grid_size,launch__registers_per_thread
  for T in ${MOE_PROFILE_TOKENS:-32 128}; do
    timeout 300 ncu --clock-control none $NB -k "$KERNELS" --launch-count "${NCU_LAUNCHES:-8}" \
      --section WarpStateStats \
      --metrics "$M" $B --what backend --backend-configs kimi --tokens "$T" --calls 1 --reps 1 \
      ${V:+--variants $V} \
      >"$OUT/ncu_kimi_t$T.log" 2>&1
    echo "ncu kimi T=$T: exit $?"
    python3 bench/cuda/ncu_per_tile.py "$OUT/ncu_kimi_t$T.log" 2>&1 | head -20
  done
fi
if [[ $STAGES == *" stalls "* ]]; then
  timeout 240 ncu --clock-control none $NB -k "$KERNELS" --launch-count "${STALL_LAUNCHES:-4}" \
    --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,smsp__inst_executed.sum' \
    $B --what backend --backend-configs kimi --tokens "${STALL_TOKENS:-128}" --calls 1 --reps 1 \
    ${V:+--variants $V} \
    >"$OUT/ncu_stalls.log" 2>&1
  echo "ncu stalls: exit $?"
  grep -E "int4_|stalled" "$OUT/ncu_stalls.log" | awk '{ if ($NF + 0 > 0.05 || /int4_/) print }' |
    sed 's/smsp__average_warps_issue_stalled_//' | cut -c1-150
fi
if [[ $STAGES == *" sass "* ]]; then
  D=build-dev/CMakeFiles/strata_backend.dir/src/backend/cuda
  for f in linear_int4_reg:int4_gemv_reg_kernelILi8ELi0ELb1ELi4E \
      moe_experts_int4_flat:int4_flat_down_kernelILi4ELi0E; do
    cuobjdump -sass "$D/${f%%:*}.cu.o" >"$OUT/all.sass"
    python3 bench/cuda/sass_loops.py "$OUT/all.sass" --kernel "${f##*:}" | cut -c1-300
    awk -v k="${f##*:}" '/Function :/ { on = index($0, k) > 0 } on' "$OUT/all.sass" \
      >"$OUT/${f##*:}.sass"
  done
  rm -f "$OUT/all.sass"
  gzip -f "$OUT"/*.sass
fi
if [[ $STAGES == *" dense "* ]]; then
  ./build-dev/strata_bench_int4_linear_bench --what ceilings,gemv >"$OUT/dense.log" 2>&1
  echo "dense: exit $?"
  grep -E "^ceiling|m=1 best|one decode token|^token" "$OUT/dense.log" | cut -c1-200 | head -40
fi
echo "total: $(( $(date +%s) - t0 )) s"
