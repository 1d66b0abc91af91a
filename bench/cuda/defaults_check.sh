#!/bin/bash
# Checks the CUDA defaults after a change to them, on the GPU machine from the repository root
# (carry .devcarry/cuda): parity of the linear/GEMV paths (and PARITY_EXTRA, e.g. the attention
# suites) and the model suites; `strata generate` on house-llama with the default CUDA graphs
# and with --disable-cuda-graph (identical greedy outputs, concurrency 4); the offline engine at
# small batches (BATCHES, default "1 8 32 64"; 8B shape, 512 in / 256 out) with the defaults.
set -u
source bench/cuda/device_env.sh  # OUT, C, PKG, dev_configure, dev_build
t0=$(date +%s)
dev_configure
dev_build strata strata_parity_test strata_bench_offline_bench
echo "build: $(( $(date +%s) - t0 )) s"
OPS='CudaParity.Linear*:CudaFusedParity.*:CudaParity.PerHeadLinear'
[ -n "${PARITY_EXTRA:-}" ] && OPS="$OPS:$PARITY_EXTRA"
MODELS='Fixtures/CudaModel.*:CudaModelGreedy.*:CudaModelLong.*'
for f in "$OPS" "$MODELS"; do
  ./build-dev/strata_parity_test --gtest_filter="$f" >"$OUT/parity.log" 2>&1
  echo "parity $f: rc $?"
  grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure" "$OUT/parity.log" | head -20
done
dev_house_prompts "$OUT/prompts.jsonl"
for mode in default disabled; do
  flag=""; [ $mode = disabled ] && flag="--disable-cuda-graph"
  ./build-dev/strata generate --device cuda --model-path $C/shared/models/house-llama --input "$OUT/prompts.jsonl" \
    -o "$OUT/out_$mode.jsonl" --max-new-tokens 64 --concurrency 4 --mem-fraction-static 0.5 --no-progress $flag \
    >"$OUT/gen_$mode.log" 2>&1
  echo "generate, graphs $mode: exit $?"; grep -E "CUDA graphs|error" "$OUT/gen_$mode.log" | sed 's/^/  /'
done
python3 - "$OUT/out_default.jsonl" "$OUT/out_disabled.jsonl" <<'PY'
import json, sys
a, b = ({r["id"]: r for r in map(json.loads, open(p))} for p in sys.argv[1:3])
print(f"identical outputs with and without graphs: {sum(a[k]['conversations'] == b[k]['conversations'] for k in a)}/{len(a)}")
PY
OB="./build-dev/strata_bench_offline_bench --config $C/shared/configs/llama-3.1-8b/config.json --tokenizer $C/shared/models/house-llama --in 512 --out 256 --breakdown-batch 0"
for bs in ${BATCHES:-1 8 32 64}; do
  STRATA_STEP_TIMING=1 $OB --prompts $bs >"$OUT/offline.log" 2>&1
  echo "batch $bs (rc $?):"; grep -E "^offline|engine steps|CUDA graphs" "$OUT/offline.log" | sed 's/^/  /'
done
echo "total: $(( $(date +%s) - t0 )) s"
