#!/bin/bash
# The house-llama EAGLE-3 drafter loop on the CPU (issue 26): strata generates greedy responses to
# the shared prompts and captures the EAGLE-3 training states (--capture-hidden-states eagle3),
# tools/eagle3_train.py trains a drafter on them (CPU), measures its teacher-forced acceptance on
# held-out prompts it never saw, and writes the parity reference tests/golden/eagle3 checks
# strata's forward against. It writes to WORK_DIR/drafter (DRAFTER_OUT); copying that over
# tests/fixtures/eagle3/house-llama replaces the committed drafter.
# The committed drafter comes from the same loop on one H200 since 2026-12-02 (capture with
# `strata generate --device cuda`, 22,600 training prompts, 2,162 GPU steps; held-out acceptance
# length 2.78 at 3 steps where this script's 90 CPU steps reached 1.47):
# bench/cuda/eagle3_train_run.sh, whose header has the commands and timings.
#
# Held out (never trained on; for the speculative engine's acceptance measurements):
#   define-19900 .. define-19999 (the last 100 lines of prompts-define.jsonl)
#   explain-02950 .. explain-02999 (the last 50 lines of prompts-explain.jsonl)
# Trained on: the first $DEFINE define prompts and the first $EXPLAIN explain prompts.
#
# Usage (from the repository root, build/strata built, Debian's python3-torch installed):
#   tools/make_house_drafter.sh [WORK_DIR]        (default /tmp/house-drafter; outputs resume)
# Timings of the CPU run that made the first committed drafter (2 CPU cores shared with ~7 other jobs, 2026-12-02): generate +
# capture 415 s (42,513 training tokens; 150 held-out records), train 1,097 s (90 steps of 8
# records, ttt 3), accept + reference 60 s. Held-out teacher-forced top-1 agreement per draft step
# 0.300 / 0.269 / 0.235; chain acceptance 0.300 / 0.114 / 0.055: mean acceptance length 1.47 at
# 3 steps, topk 1.
# Environment: DEFINE, EXPLAIN (training prompts), MAX_NEW (tokens per response), STEPS (optimizer
# steps; 90 made the first drafter: 18 minutes on 2 shared cores), MINUTES (a time cap), PY (a python with torch; default
# /usr/bin/python3), THREADS. Debian's python3-torch calls the reference BLAS (libblas3), ~25x
# slower than OpenBLAS: BLAS_DIR=DIR puts DIR first on LD_LIBRARY_PATH (e.g. the openblas-pthread
# directory of `apt-get download libopenblas0-pthread` unpacked with dpkg -x).
set -euo pipefail
WORK=${1:-/tmp/house-drafter}
SHARED=${STRATA_SHARED_DIR:-../shared}
MODEL=$SHARED/models/house-llama
DEFINE=${DEFINE:-400}
EXPLAIN=${EXPLAIN:-150}
MAX_NEW=${MAX_NEW:-64}
MINUTES=${MINUTES:-60}
PY=${PY:-/usr/bin/python3}
THREADS=${THREADS:-2}
STEPS=${STEPS:-90}
[ -n "${BLAS_DIR:-}" ] && export LD_LIBRARY_PATH=$BLAS_DIR:${LD_LIBRARY_PATH:-}
OUT=${DRAFTER_OUT:-$WORK/drafter}
mkdir -p "$WORK/in" "$WORK/train" "$WORK/heldout" "$OUT"

head -n "$DEFINE" "$SHARED/data/prompts-define.jsonl" >"$WORK/in/define-train.jsonl"
head -n "$EXPLAIN" "$SHARED/data/prompts-explain.jsonl" >"$WORK/in/explain-train.jsonl"
tail -n 100 "$SHARED/data/prompts-define.jsonl" >"$WORK/in/define-heldout.jsonl"
tail -n 50 "$SHARED/data/prompts-explain.jsonl" >"$WORK/in/explain-heldout.jsonl"

gen() {  # gen OUTDIR INPUT...
  local dir=$1
  shift
  local inputs=()
  for i in "$@"; do inputs+=(--input "$i"); done
  build/strata generate --model-path "$MODEL" "${inputs[@]}" --output-dir "$dir" \
    --max-new-tokens "$MAX_NEW" --temperature 0 --capture-hidden-states eagle3 --no-progress
}
t0=$(date +%s)
gen "$WORK/train" define="$WORK/in/define-train.jsonl" explain="$WORK/in/explain-train.jsonl"
gen "$WORK/heldout" define="$WORK/in/define-heldout.jsonl" explain="$WORK/in/explain-heldout.jsonl"
t1=$(date +%s)
echo "generate + capture: $((t1 - t0)) s"

$PY tools/eagle3_train.py train --hidden "$WORK"/train/hidden/* --target "$MODEL" \
  --out "$OUT" --draft-vocab 1024 --ttt-length 3 --batch 8 --lr 3e-3 --warmup 10 --minutes "$MINUTES" --max-steps "$STEPS" \
  --threads "$THREADS" --seed 0
t2=$(date +%s)
echo "train: $((t2 - t1)) s"

$PY tools/eagle3_train.py accept --hidden "$WORK"/heldout/hidden/* --target "$MODEL" \
  --drafter "$OUT" --steps 3 --threads "$THREADS" | tee "$WORK/heldout_accept.json"
$PY tools/eagle3_train.py reference --drafter "$OUT" --target "$MODEL" \
  --out "$OUT/reference.safetensors"
t3=$(date +%s)
echo "accept + reference: $((t3 - t2)) s"
