#!/bin/bash
# The FP8 experts' decode GEMV against x staged in f16 (CudaTunables::moe_fp8_f16, session 17),
# one build, on the GPU machine from the repository root (carry STRATA_CARRY=$PWD/.devcarry/cuda
# for the fixtures' parity; .devcarry/bench suffices with PARITY_FILTER=-). In order:
#   1. parity: the MoE kernels and backend (the f16 path: MoeFp8F16.*, MoeParity's dec-f16 rows)
#      and the DeepSeek fixtures (PARITY_FILTER overrides; "-" skips)
#   2. one DeepSeek-V3 rank's MoE layer through the backend (moe_bench --what backend) at
#      F16_TOKENS (default 1,8,32,128): the defaults (f16 x) against F16_VARIANTS (default
#      fp8_bf16x), one process, F16_REPEAT times (default 1: the spread between runs)
#   3. (KERNELS=0 skips it) the GEMV kernels alone (moe_bench --what kernels) for Moonlight (bf16)
#      and DeepSeek-V3 (FP8, bf16 x) at KERNEL_TOKENS (default 1,8,32)
#   4. (NCU=0 skips it) ncu at T = 8: the bf16-x FP8 GEMV (moe_gemv_kernel<1, ...>) and the f16
#      one (<3, ...>), warp instructions a 512-byte tile (ncu_per_tile.py); the f16 gate_up's SASS
#      loop
# Logs under $OUT; the tables on stdout.
set -u
source bench/cuda/device_env.sh
t0=$(date +%s)
dev_configure
dev_build strata_parity_test strata_bench_moe_bench
echo "build: $(( $(date +%s) - t0 )) s"
L=$OUT/fp8_f16
mkdir -p "$L"
F=${PARITY_FILTER:-MoeParity.*:MoeFp8F16.*:MoeBackend.*:MoeGemmShapes.*:SideBranch.*:Fixtures/MlaModel.*/deepseek*:*MoeModel*:*QuantModel*-*HouseMla*:*house_mla*}
[ "$F" = "-" ] || dev_parity fp8_f16 "$F" 240
for i in $(seq "${F16_REPEAT:-1}"); do
  timeout 240 ./build-dev/strata_bench_moe_bench --what backend --backend-configs dsv3 \
    --tokens "${F16_TOKENS:-1,8,32,128}" --variants "${F16_VARIANTS:-fp8_bf16x}" >"$L/moe_$i.log" 2>&1
  echo "moe run $i: exit $?"
  grep -E "^ceiling  D2D|^backend|^variant" "$L/moe_$i.log" | cut -c1-220
done
if [ "${KERNELS:-1}" = 1 ]; then
  timeout 200 ./build-dev/strata_bench_moe_bench --what kernels --configs moonlight,dsv3 \
    --tokens "${KERNEL_TOKENS:-1,8,32}" --sweep 0 >"$L/kernels.log" 2>&1
  echo "kernels: exit $?"
  grep -E "^ceiling|experts decode" "$L/kernels.log" | cut -c1-200 | head -40
fi
M=smsp__inst_executed.sum,dram__bytes_read.sum,gpu__time_duration.sum
M=$M,sm__issue_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active
M=$M,dram__throughput.avg.pct_of_peak_sustained_elapsed
[ "${NCU:-1}" = 1 ] || { echo "total: $(( $(date +%s) - t0 )) s"; exit 0; }  # NCU=0: no step 4
for f in 1 3; do
  timeout 200 ncu --clock-control none --kernel-name-base mangled -k "regex:moe_gemv_kernelILi$f" \
    --launch-count 2 --metrics "$M" ./build-dev/strata_bench_moe_bench --what backend \
    --backend-configs dsv3 --tokens 8 --calls 1 --reps 1 --variants fp8_bf16x \
    >"$L/ncu_fp8_$f.log" 2>&1
  echo "ncu fp8 kernel $f: exit $?"
done
python3 bench/cuda/ncu_per_tile.py "$L/ncu_fp8_1.log" "$L/ncu_fp8_3.log"
D=build-dev/CMakeFiles/strata_backend.dir/src/backend/cuda
cuobjdump -sass $D/moe_experts_gemv.cu.o >"$L/moe_gemv.sass"
python3 bench/cuda/sass_loops.py "$L/moe_gemv.sass" --kernel 'moe_gemv_kernelILi3ELi1ELb1' \
  --kernel 'moe_gemv_kernelILi1ELi1ELb1' | cut -c1-240
gzip -f "$L"/*.sass
echo "total: $(( $(date +%s) - t0 )) s"
