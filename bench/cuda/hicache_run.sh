#!/bin/bash
# Runs on the GPU machine (the device tool) from the repository root: the host KV tier benchmark
# (bench/cuda/hicache_bench.cc). Same setup as device_run.sh (carried pcre2/pkgconf .debs, the
# configs under .devcarry/cuda/shared); builds only strata_bench_hicache_bench. Logs go to $OUT.
# Carry: .devcarry/cuda. Arguments are passed to the benchmark.
set -u
source bench/cuda/device_env.sh  # OUT, C, P, PKG; carried deps unpacked
nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv,noheader
t0=$(date +%s)
dev_configure -DSTRATA_TESTS=OFF
dev_build strata_bench_hicache_bench
echo "build: $(( $(date +%s) - t0 )) s"
./build-dev/strata_bench_hicache_bench "$@" 2>&1 | tee "$OUT/hicache_bench.log"
