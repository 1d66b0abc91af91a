#!/bin/bash
# Speculative decoding (NGRAM) on the GPU machine, from the repository root (carry .devcarry/cuda):
# (1) house-llama greedy through `strata generate --device cuda`, with and without NGRAM, at
# concurrency 1 and 16: how many outputs are identical (bf16 verify chunks and one-token decodes
# round differently, so exactness on the GPU waits for the deterministic / batch-invariant mode;
# divergence after the first differing token is expected until then), the tok/s, the accept
# length; (2) the offline benchmark, 8B shape on random weights (NGRAM accepts next to nothing
# there: the cost of verify rows), batch 1 and 64, with and without NGRAM. Verify steps run
# eagerly (no CUDA graphs for them yet). Well under 4 minutes.
set -u
source bench/cuda/device_env.sh  # OUT, C, PKG, dev_configure, dev_build
t0=$(date +%s)
dev_configure -DSTRATA_TESTS=OFF
dev_build strata strata_bench_offline_bench
echo "build: $(( $(date +%s) - t0 )) s"
dev_house_prompts "$OUT/prompts.jsonl"
# Twice: the default kernels, then --enable-deterministic-inference (batch-invariant: a verify
# chunk's rows equal one-token decodes, so greedy output must be identical with and without NGRAM).
for mode in "" _deterministic; do
dflags=""; [ -n "$mode" ] && dflags="--enable-deterministic-inference"
for conc in 1 16; do
  for spec in off NGRAM; do
    sflags=""; [ "$spec" != off ] && sflags="--speculative-algorithm NGRAM --speculative-num-steps 4"
    t1=$(date +%s%N)
    ./build-dev/strata generate --device cuda --model-path $C/shared/models/house-llama \
      --input "$OUT/prompts.jsonl" -o "$OUT/out${mode}_c${conc}_$spec.jsonl" --max-new-tokens 128 \
      --ignore-eos --temperature 0 --concurrency $conc --mem-fraction-static 0.5 --no-progress \
      $sflags $dflags >"$OUT/gen${mode}_c${conc}_$spec.log" 2>&1
    echo "${mode:-default kernels}: concurrency $conc, speculative $spec: exit $?, $(( ($(date +%s%N) - t1) / 1000000 )) ms (load included); $(grep -o 'accept len [0-9.]*' "$OUT/gen${mode}_c${conc}_$spec.log" | tail -1)"
    grep -E "error|CHECK" "$OUT/gen${mode}_c${conc}_$spec.log" | head -3
  done
  python3 - "$OUT/out${mode}_c${conc}_off.jsonl" "$OUT/out${mode}_c${conc}_NGRAM.jsonl" <<'PY'
import json, sys
def load(p):
    return {r["id"]: r for r in map(json.loads, open(p))}
a, b = load(sys.argv[1]), load(sys.argv[2])
same = sum(a[k]["conversations"] == b[k].get("conversations") for k in a)
print(f"identical outputs with and without NGRAM: {same}/{len(a)}")
PY
done
done
for bs in 1 64; do
  for spec in off NGRAM; do
    sflags=""; [ "$spec" != off ] && sflags="--speculative-algorithm NGRAM --speculative-num-steps 3"
    ./build-dev/strata_bench_offline_bench --config $C/shared/configs/llama-3.1-8b/config.json \
      --tokenizer $C/shared/models/house-llama --prompts $bs --in 512 --out 256 --breakdown-batch 0 \
      $sflags 2>&1 | grep -E "^offline|^speculative" | sed "s/^/batch $bs, speculative $spec: /"
  done
done
echo "total: $(( $(date +%s) - t0 )) s"
