#!/bin/bash
# Runs on the GPU machine (the device tool) from the repository root: the host KV tier benchmark
# (bench/cuda/hicache_bench.cc). Same setup as device_run.sh (carried pcre2/pkgconf .debs, the
# configs under .devcarry/cuda/shared); builds only strata_bench_hicache_bench. Logs go to $OUT.
# Carry: .devcarry/cuda. Arguments are passed to the benchmark.
set -u
source bench/cuda/device_env.sh  # OUT, C, P, PKG; carried deps unpacked
nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv,noheader
t0=$(date +%s)
cmake -S . -B build-dev -G Ninja -DSTRATA_CUDA=ON -DCMAKE_BUILD_TYPE=Release -DSTRATA_TESTS=OFF \
  -DSTRATA_SHARED_DIR=$C/shared $PKG >"$OUT/cmake.log" 2>&1 || { tail -40 "$OUT/cmake.log"; exit 1; }
cmake --build build-dev -j16 --target strata_bench_hicache_bench \
  >"$OUT/build.log" 2>&1 || { grep -B3 -A12 -E "error|Error" "$OUT/build.log" | head -80; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
./build-dev/strata_bench_hicache_bench "$@" 2>&1 | tee "$OUT/hicache_bench.log"
