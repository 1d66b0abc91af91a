#!/bin/bash
# One device call that checks a session's merged work on the GPU machine, from the repository root
# with .devcarry/all carried (both house models, every fixture: bench/cuda/make_carry.sh all).
# Stages (SESSION_STAGES, in this order by default; each capped, and skipped once DEADLINE seconds have
# passed since the start, so the call ends inside the device tool's 600 s):
#   parity   the whole CUDA parity suite (tests/parity), failures listed
#   gen      `strata generate --device cuda`, 64 prompts x 128 tokens, house-llama and house-mla,
#            `--dcp-size 1` (issue 27: changes nothing), output tok/s and CPU-twin fallbacks
#   preempt  bench/cuda/preemption_kv_run.sh's soak with KV checkpoints (issue 30), capped
#   evalkv   bench/cuda/eval_kv_run.sh (issue 31; EVALKV_STAGES): stats-op parity, the house models' candidates on
#            cuda vs cpu, positions/s on the 8B shape, each capped
#   capture  bench/cuda/capture_run.sh (issue 25; CAPTURE_STAGES)
# Sub-scripts' own STAGES: EVALKV_STAGES, CAPTURE_STAGES. The .devcarry/all carry and the tracked
# tree exceed one call's 64 MiB: carry .devcarry/cuda (house-llama) or a trimmed .devcarry/mla
# (house-mla) and run twice; a stage skips a model its carry lacks.
#   load     one Kimi-K2.5 tp-8 rank, KIMI_LAYERS (default 8) layers: load time and the device
#            pool's bytes in use vs the weights kept (bench/load_bench.cc)
# Logs under $OUT/<stage>/.
set -u
export STRATA_CARRY=${STRATA_CARRY:-$PWD/.devcarry/all}
source bench/cuda/device_env.sh  # OUT, C, PKG, dev_configure, dev_build
ROOT_OUT=$OUT
T0=$(date +%s)
DEADLINE=${DEADLINE:-560}
elapsed() { echo $(( $(date +%s) - T0 )); }
dev_configure
dev_build strata strata_parity_test strata_bench_make_checkpoint strata_bench_load_bench
echo "build: $(elapsed) s"

for stage in ${SESSION_STAGES:-parity gen capture preempt evalkv load}; do
  if [ "$(elapsed)" -ge "$DEADLINE" ]; then echo "== $stage: skipped (deadline)"; continue; fi
  export OUT=$ROOT_OUT/$stage
  mkdir -p "$OUT"
  t1=$(date +%s)
  echo "== $stage"
  case $stage in
    parity)
      timeout ${PARITY_SECONDS:-170} ./build-dev/strata_parity_test --gtest_filter="${PARITY_FILTER:-*}" \
        >"$OUT/parity.log" 2>&1
      echo "  rc $? (124: cut at the cap); $(grep -c '^\[       OK' "$OUT/parity.log") passed"
      grep -E "^\[  PASSED|^\[  FAILED|tests ran" "$OUT/parity.log" | sort -u | head -20
      grep -E "^\[ RUN" "$OUT/parity.log" | tail -1 ;;
    gen)
      dev_house_prompts "$OUT/prompts.jsonl"
      python3 - "$OUT/prompts.jsonl" "$OUT/prompts64.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
with open(sys.argv[2], "w") as f:
    for k in range(64):
        r = dict(rows[k % len(rows)]); r["id"] = f"q{k}"; f.write(json.dumps(r) + "\n")
PY
      for m in house-llama house-mla; do
        [ -d "$C/shared/models/$m" ] || { echo "  $m: not in the carry"; continue; }
        timeout 60 ./build-dev/strata generate --device cuda --model-path "$C/shared/models/$m" --dcp-size 1 \
          --input "$OUT/prompts64.jsonl" -o "$OUT/$m.jsonl" --max-new-tokens 128 --temperature 0 \
          --ignore-eos --progress-interval 1000 --mem-fraction-static 0.5 >"$OUT/$m.log" 2>&1
        echo "  $m: rc $?"
        grep -E "generation .* tok/s|CPU fallback|CUDA graphs:|error|CHECK" "$OUT/$m.log" | head -5
      done ;;
    preempt)
      DEVICE=cuda SHARED=$C/shared RECORDS=64 TOKENS=4000 KILL_EVERY=2 MAX_KILLS=${MAX_KILLS:-12} \
        CHECKPOINT_INTERVAL=0.5 TEMPS=0 CONTROL=1 KEEP="$OUT/runs" \
        timeout ${PREEMPT_SECONDS:-110} bash bench/preemption_soak.sh build-dev/strata >"$OUT/preemption.log" 2>&1
      echo "  rc $?"
      grep -E "identical|differ|finished|control|no completion|uninterrupted|last run" "$OUT/preemption.log" | tail -10
      grep -h "KV checkpoints" "$OUT"/runs/*.log 2>/dev/null | sed 's/^.*KV checkpoints/KV checkpoints/' | tail -2 ;;
    evalkv)
      STAGES="${EVALKV_STAGES:-parity house tput}" EVAL_TOKENS=${EVAL_TOKENS:-2048} TPUT_SECONDS=${TPUT_SECONDS:-60} MAX_TOKENS=${MAX_TOKENS:-30000} \
        timeout ${EVALKV_SECONDS:-200} bash bench/cuda/eval_kv_run.sh 2>&1 | grep -v "^build\|nvidia" | tail -30 ;;
    capture)
      if [ -f bench/cuda/capture_run.sh ]; then
        STAGES="${CAPTURE_STAGES:-parity throughput}" timeout ${CAPTURE_SECONDS:-150} \
          bash bench/cuda/capture_run.sh 2>&1 | grep -v "^build" | tail -30
      else
        echo "  no bench/cuda/capture_run.sh"
      fi ;;
    load)
      timeout 90 ./build-dev/strata_bench_load_bench --config "$C/shared/configs/kimi-k2.5/config.json" \
        --layers ${KIMI_LAYERS:-8} --tp-size 8 --backend cuda --reps 1 --dir /tmp/ld_kimi >"$OUT/load.log" 2>&1
      echo "  rc $?"
      grep -E "^load|^checkpoint|^device pool|error|CHECK" "$OUT/load.log" | head -5 ;;
  esac
  echo "  ($stage: $(( $(date +%s) - t1 )) s; $(elapsed) s so far)"
done
echo "total: $(elapsed) s"
