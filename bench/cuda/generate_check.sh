#!/bin/bash
# Issue 24's `strata generate` = engine check on one model shape (default the Moonlight shape), on
# the GPU machine from the repository root, with a slim carry (STRATA_CARRY=$PWD/.devcarry/gen:
# bash bench/cuda/make_carry.sh gen): a random checkpoint in the stored format written by
# strata_bench_make_checkpoint (bench_checkpoint.h: the distribution offline_bench fills its device
# copies with), then
#   (1) `strata generate --device cuda` on PROMPTS (1,000) short chat prompts of
#       data/prompts-explain.jsonl x 1,024 tokens, --ignore-eos, greedy: the product's path;
#   (2) the engine benchmark (offline_bench) at the same shape: as many prompts, each of the
#       generate run's mean prompt length, 1,024 out.
# The two rates should agree within 5% (issue 24; the 8B Llama shape: 21,317 vs 20,548 tok/s).
# Logs in $OUT/generate_check/.
set -u
source bench/cuda/device_env.sh
t0=$(date +%s)
dev_configure
dev_build strata strata_bench_offline_bench strata_bench_make_checkpoint
echo "build: $(( $(date +%s) - t0 )) s"
L=$OUT/generate_check
W=/tmp/generate_check
mkdir -p "$L" "$W"
CONFIG=$C/shared/configs/${MODEL:-moonlight-16b-a3b}/config.json
TOK=$C/shared/models/house-llama
N=${PROMPTS:-1000}
./build-dev/strata_bench_make_checkpoint --config "$CONFIG" --out "$W/model" --tokenizer "$TOK" \
  >"$L/make_checkpoint.log" 2>&1
echo "checkpoint: exit $?; $(tail -1 "$L/make_checkpoint.log")"
head -"$N" "$C/shared/data/prompts-explain.jsonl" >"$W/prompts.jsonl"
t1=$(date +%s)
timeout ${GEN_TIMEOUT:-240} ./build-dev/strata generate --device cuda --model-path "$W/model" \
  --input "$W/prompts.jsonl" -o "$W/out.jsonl" --max-new-tokens 1024 --ignore-eos --temperature 0 \
  --progress-interval 10 >"$L/generate.log" 2>&1
echo "generate: exit $?, $(( $(date +%s) - t1 )) s"
grep -E "finished in|generation|CPU fallback|CUDA graphs:|error" "$L/generate.log" | cut -c1-300 | head -8
IN=$(python3 -c "
import json
r = [json.loads(l) for l in open('$W/out.jsonl')]
print(round(sum(x['meta']['prompt_tokens'] for x in r) / max(1, len(r))))" 2>/dev/null || echo 30)
echo "generate: mean prompt $IN tokens"
rm -rf "$W/model"
timeout ${ENGINE_TIMEOUT:-240} ./build-dev/strata_bench_offline_bench --config "$CONFIG" --tokenizer "$TOK" \
  --prompts "$N" --in "$IN" --out 1024 --breakdown-batch 0 >"$L/engine.log" 2>&1
echo "engine: exit $?"
grep -E "^offline|^decode|CUDA graphs:" "$L/engine.log" | cut -c1-300
echo "total: $(( $(date +%s) - t0 )) s"
