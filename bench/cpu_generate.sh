#!/usr/bin/env bash
# CPU throughput of strata generate on house-llama: one sequence's decode rate, then 256 prompts
# at concurrency 1 vs the default (continuous batching). Wall time includes model load (~0.2 s).
# Usage: bench/cpu_generate.sh [path/to/strata]
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-build/strata}
MODEL=../shared/models/house-llama
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
head -n 256 ../shared/data/prompts-define.jsonl > "$TMP/prompts.jsonl"

# rate <label> <jsonl> <seconds>: completion tokens / wall seconds
rate() {
  local toks
  toks=$(jq -s 'map(.meta.completion_tokens) | add' "$2")
  echo "$1: $toks generated tokens in $3 s = $(echo "scale=1; $toks / $3" | bc) tok/s"
}

start=$(date +%s.%N)
"$BIN" generate --model-path "$MODEL" --prompt 'What does the word "harbor" mean?' --jsonl \
  --max-new-tokens 256 --ignore-eos --temperature 0 2>/dev/null > "$TMP/single.jsonl"
rate "single sequence (19-token prompt, 256 new tokens)" "$TMP/single.jsonl" \
  "$(echo "$(date +%s.%N) - $start" | bc)"

for conc in 1 default; do
  extra=""; [ "$conc" != default ] && extra="--max-running-requests $conc"
  start=$(date +%s.%N)
  "$BIN" generate --model-path "$MODEL" --input "$TMP/prompts.jsonl" --output "$TMP/out-$conc.jsonl" \
    --max-new-tokens 32 --temperature 0 --no-progress $extra 2>/dev/null
  rate "256 prompts x 32 new tokens, max-running-requests=$conc" "$TMP/out-$conc.jsonl" \
    "$(echo "$(date +%s.%N) - $start" | bc)"
done
cmp <(jq -c '[.id, .conversations]' "$TMP/out-1.jsonl" | sort) \
    <(jq -c '[.id, .conversations]' "$TMP/out-default.jsonl" | sort) \
  && echo "outputs identical at both concurrencies"
