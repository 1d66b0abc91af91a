#!/usr/bin/env bash
# Preemption-safe long generations, full size (issue 30): RECORDS records of TOKENS tokens each
# (house-llama, cpu), generated once uninterrupted and once under `kill -9` every KILL_EVERY
# seconds (the same command restarted at once, like a preemptible machine's job requeued), then
# compared record by record. Greedy and seeded sampling. The CI version is
# tests/e2e/generate/preemption_test.cc (3 x 240 tokens).
# With KV checkpoints (--checkpoint-kv, on by default) a restarted job loads each unfinished
# record's KV rows from OUTPUT.partial.kv and decodes on: it advances whenever KILL_EVERY exceeds
# model load + reading the rows. With CHECKPOINT_KV=off it re-prefills prompt + partial output
# first, and then advances only when KILL_EVERY exceeds load + that prefill (house-llama on a
# 2-core CPU prefills ~200-500 tokens/s). The script stops (failing) after MAX_KILLS kills.
# CONTROL=1 also compares a second uninterrupted run with the first (on a GPU: whether the
# kernels alone are run-to-run deterministic).
# Usage: bench/preemption_soak.sh [path/to/strata]
#   (env: RECORDS=4 TOKENS=4000 KILL_EVERY=60 MAX_KILLS=200 DEVICE=cpu SHARED=../shared
#    TEMPS="0 0.8" CHECKPOINT_INTERVAL=2 CHECKPOINT_KV=auto CONTROL=0
#    GEN_FLAGS="--enable-deterministic-inference": extra flags of every generate run)
# On the GPU (device machine, with a carry holding models/house-llama and data/):
#   DEVICE=cuda SHARED=.devcarry/cuda/shared KILL_EVERY=5 bash bench/preemption_soak.sh build-dev/strata
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-build/strata}
RECORDS=${RECORDS:-4}
TOKENS=${TOKENS:-4000}
KILL_EVERY=${KILL_EVERY:-60}
MAX_KILLS=${MAX_KILLS:-200}
DEVICE=${DEVICE:-cpu}
SHARED=${SHARED:-../shared}
TEMPS=${TEMPS:-0 0.8}
CHECKPOINT_INTERVAL=${CHECKPOINT_INTERVAL:-2}
CHECKPOINT_KV=${CHECKPOINT_KV:-auto}
CONTROL=${CONTROL:-0}
TMP=$(mktemp -d)
# KEEP=DIR keeps the runs' files (outputs, partials, logs) there.
trap 'if [ -n "${KEEP:-}" ]; then mkdir -p "$KEEP"; cp -r "$TMP"/. "$KEEP"/; fi; rm -rf "$TMP"' EXIT
head -n "$RECORDS" "$SHARED/data/prompts-explain.jsonl" > "$TMP/in.jsonl"

compare() {  # reference output: prints identical records, exits 1 unless all are
  python3 - "$1" "$2" <<'PY'
import json, sys
def load(p):
    return {json.loads(l)["id"]: json.loads(l) for l in open(p)}
ref, out = load(sys.argv[1]), load(sys.argv[2])
same = sum(ref[k]["conversations"][-1]["content"] == out.get(k, {}).get("conversations", [{}])[-1].get("content")
           for k in ref)
print(f"  identical records: {same} of {len(ref)} (output holds {len(out)})")
# Where the others first differ, as a fraction of the record's text: right after the resume
# point hints at the resume, later at numerics that drift.
fracs = []
for k in ref:
    a = ref[k]["conversations"][-1]["content"]
    b = out.get(k, {}).get("conversations", [{}])[-1].get("content") or ""
    if a != b:
        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        fracs.append(n / max(1, len(a)))
if fracs:
    fracs.sort()
    print(f"  differing records: first difference at {fracs[0]:.2f} / {fracs[len(fracs) // 2]:.2f} / "
          f"{fracs[-1]:.2f} (min / median / max) of the text")
sys.exit(0 if same == len(ref) == len(out) else 1)
PY
}

status=0
for temp in $TEMPS; do
  cmd=("$BIN" generate --device "$DEVICE" --model-path "$SHARED/models/house-llama" --input "explain=$TMP/in.jsonl"
       --max-new-tokens "$TOKENS" --ignore-eos --temperature "$temp" --seed 11
       --checkpoint-interval "$CHECKPOINT_INTERVAL" --checkpoint-kv "$CHECKPOINT_KV" --no-progress
       ${GEN_FLAGS:-})
  start=$(date +%s)
  "${cmd[@]}" --output "$TMP/ref-$temp.jsonl" 2>"$TMP/ref-$temp.log"
  echo "temperature $temp: uninterrupted run $(( $(date +%s) - start )) s"
  grep -h "KV checkpoints: on\|KV checkpoints: off" "$TMP/ref-$temp.log" | head -1 | sed 's/^/  /' || true
  if [ "$CONTROL" = 1 ]; then
    "${cmd[@]}" --output "$TMP/ref2-$temp.jsonl" 2>"$TMP/ref2-$temp.log"
    echo "  control: a second uninterrupted run against the first"
    compare "$TMP/ref-$temp.jsonl" "$TMP/ref2-$temp.jsonl" || true
  fi
  start=$(date +%s)
  kills=0
  while true; do
    "${cmd[@]}" --output "$TMP/out-$temp.jsonl" 2>>"$TMP/out-$temp.log" &
    pid=$!
    for _ in $(seq $((KILL_EVERY * 10))); do
      sleep 0.1
      kill -0 "$pid" 2>/dev/null || break
    done
    if kill -0 "$pid" 2>/dev/null; then
      kill -9 "$pid"; wait "$pid" 2>/dev/null || true
      kills=$((kills + 1))
      cp "$TMP/out-$temp.jsonl.partial.jsonl" "$TMP/partial-$temp-$kills.jsonl" 2>/dev/null || true
      checkpointed=$(python3 -c 'import json,sys
t={}
for l in open(sys.argv[1]):
    try: j=json.loads(l)
    except ValueError: continue
    k=(j["dataset"],j["id"]); t[k]=j["from"]+len(j["tokens"])
print(sum(t.values()))' "$TMP/out-$temp.jsonl.partial.jsonl" 2>/dev/null || echo 0)
      echo "  kill $kills: $(wc -l < "$TMP/out-$temp.jsonl" 2>/dev/null || echo 0) records done," \
           "$checkpointed tokens of unfinished records checkpointed," \
           "KV side file $(( $(stat -c %s "$TMP/out-$temp.jsonl.partial.kv" 2>/dev/null || echo 0) / 1000000 )) MB"
      if [ "$kills" -ge "$MAX_KILLS" ]; then echo "no completion after $kills kills" >&2; exit 1; fi
    else
      wait "$pid"  # finished (a failure stops the script: set -e)
      break
    fi
  done
  echo "temperature $temp: finished after $kills kills in $(( $(date +%s) - start )) s"
  grep -h "KV checkpoints: .* downloaded" "$TMP/out-$temp.log" | tail -1 | sed 's/^.*KV checkpoints/  last run: KV checkpoints/' || true
  grep -h "are not loaded\|missing; they are prefilled\|dropping" "$TMP/out-$temp.log" | sort | uniq -c | head -5 || true
  compare "$TMP/ref-$temp.jsonl" "$TMP/out-$temp.jsonl" || status=1
done
exit $status
