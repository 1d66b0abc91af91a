#!/usr/bin/env bash
# Throughput of the data-generation workload: prompts-define (20,000 chat prompts) through
# `strata serve` (house-llama, CPU by default) with `strata generate --server`, resumable output.
# Prints the generator's summary (prompt and generation tokens/s, wall time).
#
#   bench/generate_define.sh [BUILD_DIR]
# Environment (defaults in brackets):
#   N [20000] prompts (the first N of the file)      MAX_NEW_TOKENS [128]
#   CONCURRENCY [64] parallel requests              PORT [30117]
#   MODE [server] server | engine (in-process engine, no HTTP)
#   SERVER_URL [] use a running server instead of starting one (strata, SGLang, vLLM)
#   SERVE_FLAGS [] extra flags for `strata serve` (e.g. --device cuda --max-running-requests 256)
#   OUT [/tmp/strata-bench-define] output directory (removed first: a fresh run, not a resume)
set -euo pipefail
BUILD=${1:-build}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
STRATA=$ROOT/$BUILD/strata
SHARED=${STRATA_SHARED_DIR:-$ROOT/../shared}
MODEL=$SHARED/models/house-llama
N=${N:-20000}
MAX_NEW_TOKENS=${MAX_NEW_TOKENS:-128}
CONCURRENCY=${CONCURRENCY:-64}
PORT=${PORT:-30117}
MODE=${MODE:-server}
OUT=${OUT:-/tmp/strata-bench-define}
rm -rf "$OUT" && mkdir -p "$OUT"
head -n "$N" "$SHARED/data/prompts-define.jsonl" > "$OUT/define.jsonl"

echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(uname -n) $(nproc) cores; mode=$MODE N=$N max_new_tokens=$MAX_NEW_TOKENS concurrency=$CONCURRENCY"
GEN=("$STRATA" generate --input "define=$OUT/define.jsonl" --output "$OUT/define.out.jsonl"
     --max-new-tokens "$MAX_NEW_TOKENS" --temperature 0 --concurrency "$CONCURRENCY")
SUMMARY='^\[generate\] (finished|stopped|define:)|Maximum resident|Elapsed \(wall'
if [[ $MODE == engine ]]; then
  /usr/bin/time -v "${GEN[@]}" --model-path "$MODEL" 2> "$OUT/generate.log" || { tail "$OUT/generate.log"; exit 1; }
  grep -E "$SUMMARY" "$OUT/generate.log"
  exit
fi
URL=${SERVER_URL:-}
if [[ -z $URL ]]; then
  URL=http://127.0.0.1:$PORT
  "$STRATA" serve --model-path "$MODEL" --host 127.0.0.1 --port "$PORT" ${SERVE_FLAGS:-} > "$OUT/serve.log" 2>&1 &
  SERVER_PID=$!
  trap 'kill $SERVER_PID 2>/dev/null || true' EXIT
  for _ in $(seq 1 600); do
    curl -sf "$URL/health" > /dev/null 2>&1 && break
    kill -0 $SERVER_PID 2>/dev/null || { echo "strata serve exited:"; cat "$OUT/serve.log"; exit 1; }
    sleep 0.5
  done
fi
# Progress lines go to $OUT/generate.log (tail -f it); the summary prints at the end.
/usr/bin/time -v "${GEN[@]}" --server "$URL" 2> "$OUT/generate.log" || { tail "$OUT/generate.log"; exit 1; }
grep -E "$SUMMARY" "$OUT/generate.log"
echo "records: $(wc -l < "$OUT/define.out.jsonl")"
