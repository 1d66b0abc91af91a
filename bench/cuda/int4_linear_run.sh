#!/bin/bash
# The W4A16 (INT4) linears (src/backend/cuda/linear_int4*.cu) on the GPU machine, from the
# repository root, `.devcarry/cuda` carried (the pcre2/pkgconf debs the configure needs; no model
# or fixture is read):
#   1. build strata_parity_test and strata_bench_int4_linear_bench (Release, build-dev);
#   2. resources: registers, spills and shared memory of the int4 kernels (cuobjdump -res-usage,
#      where the image has cuobjdump), counts of their 16-byte loads, bulk copies and mma in
#      SASS, and the instructions per tile of the GEMV main loops (bench/cuda/sass_loops.py);
#   3. parity: strata_parity_test --gtest_filter='*Int4*' (device layout byte for byte, dequant
#      bit for bit, the register, stream and mma GEMVs, with SwiGLU, and the GEMM against
#      float64 host references);
#   4. bench: strata_bench_int4_linear_bench (ceilings; per 8B shape and m = 1..32 the GEMV the
#      launcher picks, the mma and stream GEMVs and the GEMM, in CUDA graphs; the register
#      GEMV's knob sweep; one decode token's 128 GEMVs as a model runs them, per kernel and
#      knob variant; GEMM per m against bf16 cuBLAS and dequant + cuBLAS; BENCH_ARGS adds
#      flags, e.g. "--what ceilings,gemv" to skip the GEMM part).
# Logs in $OUT: cmake.log, build.log, resources.txt, sass_counts.txt, parity.log, bench.log.
# Stages can be skipped: STAGES="parity bench" (default "resources parity bench").
# Run: device tool, carry [".devcarry/cuda"], command `bash bench/cuda/int4_linear_run.sh`.
set -u
source bench/cuda/device_env.sh  # OUT, C, PKG, dev_configure, dev_build; carried deps unpacked
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
t0=$(date +%s)
dev_configure
dev_build strata_parity_test strata_bench_int4_linear_bench
echo "build: $(( $(date +%s) - t0 )) s"
for stage in ${STAGES:-resources parity bench}; do
  case $stage in
    resources)
      objs=$(find build-dev -name 'linear_int4*.cu.o')
      dump=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
      if [ -x "$dump" ]; then
        for o in $objs; do "$dump" -res-usage "$o"; done >"$OUT/resources.txt" 2>&1
        # One line per kernel: its name and REG / STACK / SHARED / LOCAL.
        grep -A1 "Function" "$OUT/resources.txt" | paste - - - 2>/dev/null |
          sed -E 's/.*Function ([^:]*):.*(REG:[0-9]+) (STACK:[0-9]+) (SHARED:[0-9]+) (LOCAL:[0-9]+).*/\2 \3 \4 \5 \1/' | head -60
        for o in $objs; do
          "$dump" -sass "$o" >"$OUT/sass_$(basename "$o").txt" 2>&1
          echo "$(basename "$o"): $(grep -cE 'LDG\.[A-Z.]*128' "$OUT/sass_$(basename "$o").txt") 16-byte LDG," \
            "$(grep -c 'LDGSTS' "$OUT/sass_$(basename "$o").txt") LDGSTS, $(grep -c 'HGMMA' "$OUT/sass_$(basename "$o").txt") HGMMA," \
            "$(grep -c 'HMMA' "$OUT/sass_$(basename "$o").txt") HMMA, $(grep -c 'UBLKCP' "$OUT/sass_$(basename "$o").txt") UBLKCP," \
            "$(grep -cE '\bSTL\b|\bLDL\b' "$OUT/sass_$(basename "$o").txt") local loads/stores"
        done | tee "$OUT/sass_counts.txt"
        # GEMV main loops: the register GEMV <ring, tiles per group, rounded> and the stream
        # GEMV <tiles per stage, tiles per group, rounded> (group 128: 2 tiles per group), the
        # mma GEMV <1 n tile, k split, plain>. The register GEMV's loop multiplies 16 (8) tiles.
        python3 bench/cuda/sass_loops.py "$OUT/sass_linear_int4_reg.cu.o.txt" \
          --kernel ILi16ELi2ELb0E --kernel ILi8ELi2ELb0E --kernel ILi16ELi2ELb1E \
          | tee "$OUT/sass_loops.txt"
        python3 bench/cuda/sass_loops.py "$OUT/sass_linear_int4_stream.cu.o.txt" \
          --kernel ILi8ELi2ELb0E | tee -a "$OUT/sass_loops.txt"
        python3 bench/cuda/sass_loops.py "$OUT/sass_linear_int4.cu.o.txt" \
          --kernel gemv_kernelILi1ELi8ELb0E | tee -a "$OUT/sass_loops.txt"
      else
        echo "resources: no cuobjdump on this image"
      fi ;;
    parity)
      t1=$(date +%s)
      # Into a file first: a pipe closed early would kill the suite with SIGPIPE mid-run.
      timeout 120 ./build-dev/strata_parity_test --gtest_filter='*Int4*' >"$OUT/parity.log" 2>&1
      parity_rc=$?
      echo "parity: rc $parity_rc ($(( $(date +%s) - t1 )) s)"
      grep -E "^\[ RUN" "$OUT/parity.log" | tail -1
      grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|^\[       OK|Failure|Expected|Which is|differ|wrote past" "$OUT/parity.log" | head -60
      grep -E "int4 gemv ksplit=0 m=(1|16|32) n=517|int4 gemm tokens=0 ksplit=0 m=(1|33|200) n=1000|8B|swiglu ksplit=0 m=(1|17)|(stream|reg) knobs=0 m=(1|8) n=(517|129)|(stream|reg)\+swiglu knobs=0 m=(1|8)|skipped" "$OUT/parity.log" | head -50 ;;
    bench)
      if [ "${parity_rc:-0}" = 124 ]; then echo "bench: skipped (parity hung)"; continue; fi
      t1=$(date +%s)
      timeout 150 ./build-dev/strata_bench_int4_linear_bench ${BENCH_ARGS:-} >"$OUT/bench.log" 2>&1
      echo "bench: rc $? ($(( $(date +%s) - t1 )) s)"
      grep -E "^ceiling|^device|WRONG|^token|m=1 best|eager" "$OUT/bench.log" | head -50
      grep -E "^gemv .* m=(1 |8 |16|32)" "$OUT/bench.log" | head -40
      grep -E "^summary" "$OUT/bench.log" ;;
  esac
done
echo "total: $(( $(date +%s) - t0 )) s"
