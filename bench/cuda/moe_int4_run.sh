#!/bin/bash
# Issue 23, INT4 (W4A16) routed experts at decode sizes (wip/moeperf2) on the GPU machine, from
# the repository root. Binaries are built on the CPU machine (no GPU code differs: nvcc 13,
# sm_90a) and carried, so the call spends its time measuring:
#   here:   ninja -C build-cuda strata_bench_moe_bench strata_parity_test, then for each:
#           strip -o .devcarry/bin/<name> build-cuda/<name> && gzip -f .devcarry/bin/<name>
#           (a bench of the base commit as .devcarry/bin/moe_bench_base.gz or .xz: "before");
#           beside bin/: lib/ with this machine's libspdlog.so.1.10 and libfmt.so.9 (the image
#           has neither) and libcxx/ with its libstdc++.so.6 (used only if the image's is older)
#   device: carry [".devcarry/cuda/debs", ".devcarry/cuda/shared/configs", ".devcarry/bin"],
#           command `bash bench/cuda/moe_int4_run.sh` (STAGES picks: parity kernels backend
#           base ncu). The device call sends the session's checkout: from a helper's worktree,
#           copy this script and the binaries into an ignored folder of that checkout, carry it
#           and set BIN_DIR to its binaries.
# Logs under $OUT: parity.log, kernels.log (per projection, the GEMV shape sweep, copy ceiling),
# backend.log (one layer through the backend ops), ncu.log (T = 128 Kimi rank GEMVs).
set -u
OUT=${OUT:-/tmp/strata_out}
mkdir -p "$OUT"
C=$PWD/.devcarry/cuda
P=/tmp/strata_deps
mkdir -p $P
for f in $C/debs/*.deb; do dpkg -x "$f" $P; done
export LD_LIBRARY_PATH=$P/usr/lib/x86_64-linux-gnu:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
# The binaries were configured with STRATA_SHARED_DIR=<worktree>/../shared (the CPU machine's
# build): that worktree's path must exist for `..` to resolve (BUILT_IN, default this branch's).
mkdir -p ${BUILT_IN:-/work/wt-moeperf2} && { [ -e /work/shared ] || ln -s $C/shared /work/shared; }
B=/tmp/strata_bin
mkdir -p $B
for f in ${BIN_DIR:-.devcarry/bin}/*; do
  case $f in
    *.gz) python3 -c "import gzip,sys; open(sys.argv[2],'wb').write(gzip.open(sys.argv[1]).read())" $f $B/$(basename $f .gz) ;;
    *.xz) python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" $f $B/$(basename $f .xz) ;;
    *) cp $f $B/ ;;
  esac
done
chmod +x $B/*
ls -la $B
# Libraries the CPU machine's build links that the image lacks (spdlog, fmt; libstdc++ only if the
# image's is older): .devcarry/lib, .devcarry/libcxx beside the binaries' folder.
L=$(cd ${BIN_DIR:-.devcarry/bin}/.. && pwd)
export LD_LIBRARY_PATH=$L/lib:$LD_LIBRARY_PATH
ldd $B/strata_parity_test | grep -q "GLIBCXX.*not found" && export LD_LIBRARY_PATH=$L/libcxx:$LD_LIBRARY_PATH
ldd $B/strata_parity_test $B/strata_bench_moe_bench | grep "not found"
# Registers, stack (spills) and shared memory of the MoE GEMV kernels.
cuobjdump -res-usage $B/strata_bench_moe_bench 2>/dev/null | grep -A1 "moe_gemv_kernel" |
  grep -oE "moe_gemv_kernelILi[0-9]ELi[0-9]ELb[01]|REG:[0-9]+ STACK:[0-9]+ SHARED:[0-9]+" | paste - - | sort -u | head -24
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
git log -1 --oneline 2>/dev/null
T=${TOKENS:-1,8,64,128}
t0=$(date +%s)
for stage in ${STAGES:-parity kernels backend base ncu}; do
  t1=$(date +%s)
  case $stage in
    parity)
      timeout ${PARITY_TIMEOUT:-60} $B/strata_parity_test --gtest_filter="${PARITY_FILTER:-MoeParity.*:MoeBackend.*}" \
        >"$OUT/parity.log" 2>&1
      echo "parity: rc $?"
      grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure|CHECK failed|CUDA: " "$OUT/parity.log" | head -20
      grep -hE "^experts .*int4" "$OUT/parity.log" | awk '{print $NF, $0}' | sort -g -r | cut -d' ' -f2- | head -3 ;;
    kernels)
      timeout ${KERNELS_TIMEOUT:-90} $B/strata_bench_moe_bench --what kernels --configs ${CONFIGS:-kimi,moonlight-int4} \
        --tokens $T --sweep ${SWEEP:-1} --sweep-max-tokens 128 >"$OUT/kernels.log" 2>&1
      echo "kernels: rc $?"
      grep -E "^(ceiling|config|moe|sweep)" "$OUT/kernels.log" | grep -v "experts prefill" | head -60 ;;
    backend)
      timeout ${BACKEND_TIMEOUT:-40} $B/strata_bench_moe_bench --what backend --backend-configs kimi \
        --tokens $T >"$OUT/backend.log" 2>&1
      echo "backend: rc $?"
      grep -E "^(ceiling|backend)" "$OUT/backend.log" | head -20 ;;
    base)  # the same two benches with the base commit's kernels
      timeout ${BASE_TIMEOUT:-40} $B/moe_bench_base --what kernels --configs ${CONFIGS:-kimi,moonlight-int4} \
        --tokens $T --sweep 0 >"$OUT/kernels_base.log" 2>&1
      echo "kernels base: rc $?"
      grep -E "^moe .*experts decode" "$OUT/kernels_base.log" | head -20
      timeout ${BASE_TIMEOUT:-40} $B/moe_bench_base --what backend --backend-configs kimi \
        --tokens $T >"$OUT/backend_base.log" 2>&1
      echo "backend base: rc $?"
      grep -E "^backend" "$OUT/backend_base.log" | head -20 ;;
    ncu)
      timeout ${NCU_TIMEOUT:-60} ncu --clock-control none -k regex:moe_gemv --launch-count 2 \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
        --section LaunchStats --section WarpStateStats --section SchedulerStats \
        $B/strata_bench_moe_bench --what kernels --configs kimi --tokens 128 --sweep 0 --calls 1 \
        --reps 1 >"$OUT/ncu.log" 2>&1
      echo "ncu: rc $?"
      grep -E "moe_gemv_kernel|Memory Throughput|DRAM Throughput|Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|Stall|Issued Warp|No Eligible|Eligible Warps|Block Limit|Waves Per SM|Grid Size|L2 Hit|L1/TEX Hit" "$OUT/ncu.log" | head -70 ;;
  esac
  echo "stage $stage: $(( $(date +%s) - t1 )) s"
done
echo "total: $(( $(date +%s) - t0 )) s"
