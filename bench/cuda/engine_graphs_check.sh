#!/bin/bash
# The engine's CUDA graphs (--cuda-graph-max-bs) on the GPU machine, from the repository root
# (carry .devcarry/cuda): (1) house-llama greedy outputs through `strata generate --device cuda`
# with graphs off and on (concurrency 1 and 4: batch sizes 1-4 replay, prompts of several
# lengths) must be identical; (2) decode at small batch through the offline benchmark, 8B shape,
# graphs off vs on (GRAPH_BATCHES, default "1 8 32": prompts = batch, 512 in / 256 out).
set -u
source bench/cuda/device_env.sh  # OUT, C, PKG, dev_configure, dev_build
t0=$(date +%s)
dev_configure -DSTRATA_TESTS=OFF
dev_build strata strata_bench_offline_bench
echo "build: $(( $(date +%s) - t0 )) s"
dev_house_prompts "$OUT/prompts.jsonl"
for conc in 1 4; do
  for g in 0 16; do
    t1=$(date +%s%N)
    ./build-dev/strata generate --device cuda --model-path $C/shared/models/house-llama \
      --input "$OUT/prompts.jsonl" -o "$OUT/out_c${conc}_g$g.jsonl" --max-new-tokens 64 --concurrency $conc \
      --mem-fraction-static 0.5 --no-progress --cuda-graph-max-bs $g >"$OUT/gen_c${conc}_g$g.log" 2>&1
    echo "concurrency $conc, --cuda-graph-max-bs $g: exit $?, $(( ($(date +%s%N) - t1) / 1000000 )) ms (load included)"
    grep -E "error|CHECK" "$OUT/gen_c${conc}_g$g.log" | head -3
  done
  python3 - "$OUT/out_c${conc}_g0.jsonl" "$OUT/out_c${conc}_g16.jsonl" <<'PY'
import json, sys
def load(p):
    return {r["id"]: r for r in map(json.loads, open(p))}
a, b = load(sys.argv[1]), load(sys.argv[2])
same = sum(a[k]["conversations"] == b[k].get("conversations") for k in a)
print(f"identical outputs with and without graphs: {same}/{len(a)}")
PY
done
for bs in ${GRAPH_BATCHES:-1 8 32}; do
  for g in 0 $bs; do
    ./build-dev/strata_bench_offline_bench --config $C/shared/configs/llama-3.1-8b/config.json \
      --tokenizer $C/shared/models/house-llama --prompts $bs --in 512 --out 256 --breakdown-batch 0 \
      --cuda-graph-max-bs $g 2>&1 | grep -E "^offline" | sed "s/^/batch $bs, cuda-graph-max-bs $g: /"
  done
done
echo "total: $(( $(date +%s) - t0 )) s"
