#!/bin/bash
# Offline throughput with and without the host KV tier (issue 6), on the GPU machine from the
# repository root (carry .devcarry/cuda): strata_bench_offline_bench (1,000 x 1,024 / 1,024, 8B
# shape) for each argument list in RUNS (one per line; default: fp8_e4m3 KV with the tier, the same
# without it, bf16 KV with the tier), STRATA_STEP_TIMING=1, progress every 10 s. PARITY_FILTER
# (default CudaFusedParity.*) runs strata_parity_test first; NSYS=1 then profiles batch-1 decode in
# the engine (offline_bench, 1 prompt) and in llama_bench's loop (decode mode 4) with Nsight Systems
# and prints each one's kernel summary.
set -u
source bench/cuda/device_env.sh  # OUT, C, PKG, dev_configure, dev_build
t0=$(date +%s)
dev_configure
dev_build strata_bench_offline_bench strata_bench_llama_bench strata_parity_test
echo "build: $(( $(date +%s) - t0 )) s"
if [ -n "${PARITY_FILTER-CudaFusedParity.*}" ]; then
  ./build-dev/strata_parity_test --gtest_filter="${PARITY_FILTER-CudaFusedParity.*}" >"$OUT/parity.log" 2>&1
  echo "parity (rc $?):"; grep -E "^\[  (PASSED|FAILED) |^\[==========\]|FAILED  \]" "$OUT/parity.log"
fi
OB="./build-dev/strata_bench_offline_bench --config $C/shared/configs/llama-3.1-8b/config.json --tokenizer $C/shared/models/house-llama --breakdown-batch 0"
TIER="--hicache-ratio 0.2 --hicache-write-policy write_back"
RUNS=${RUNS:-"--kv-cache-dtype fp8_e4m3 --mem-fraction 0.92 --schedule-conservativeness 1.5 $TIER
--kv-cache-dtype fp8_e4m3 --mem-fraction 0.92 --schedule-conservativeness 1.5
--mem-fraction 0.92 $TIER"}
k=0
while IFS= read -r args; do
  [ -z "$args" ] && continue
  k=$((k + 1))
  STRATA_STEP_TIMING=1 $OB $args >"$OUT/offline_$k.log" 2>&1
  echo "offline $args (rc $?):"
  grep -E "^engine|^progress|^offline|^step|Host KV tier|CUDA graphs|engine steps|eager steps" "$OUT/offline_$k.log" | sed "s/^/  /" | cut -c1-330 | tail -40
done <<<"$RUNS"
if [ "${NSYS:-0}" = 1 ] && command -v nsys >/dev/null; then
  nsys profile -o "$OUT/engine_b1" --force-overwrite true $OB --prompts 1 --in 512 --out 256 >"$OUT/nsys_engine.log" 2>&1
  nsys stats -r cuda_gpu_kern_sum,cuda_api_sum "$OUT/engine_b1.nsys-rep" 2>/dev/null | head -60
  DECODE_MODES=4 nsys profile -o "$OUT/bench_b1" --force-overwrite true ./build-dev/strata_bench_llama_bench --what decode >"$OUT/nsys_bench.log" 2>&1
  nsys stats -r cuda_gpu_kern_sum,cuda_api_sum "$OUT/bench_b1.nsys-rep" 2>/dev/null | head -60
  rm -f "$OUT"/*.nsys-rep "$OUT"/*.sqlite
elif [ "${NSYS:-0}" = 1 ]; then
  echo "nsys: not installed"; ls /usr/local/cuda/bin | head -50
fi
echo "total: $(( $(date +%s) - t0 )) s"
