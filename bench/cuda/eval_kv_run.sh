#!/bin/bash
# eval-kv on the GPU (issue 31), from the repository root on the GPU machine. The house models do
# not both fit one 64 MiB carry, so this runs once per carry; a house model that is not in the
# carry is skipped with a message:
#   carry .devcarry/cuda:  bench/cuda/eval_kv_run.sh                                 (house-llama, 8B)
#   carry .devcarry/mla:   STRATA_CARRY=$PWD/.devcarry/mla STAGES="parity house" bench/cuda/eval_kv_run.sh
# Stages (STAGES, default "parity house tput"):
#   parity  Backend::logit_stats on the GPU against the CPU op (tests/parity/logit_stats_parity_test.cc)
#           and its speed on 4,096 rows of the 8B vocabulary
#   house   every candidate (house-llama: fp8_e4m3, fp8_e5m2, mixed bf16 layers; house-mla: those,
#           fp8_flashmla and the bf16 rope part) with `strata eval-kv --device cuda` and with
#           `--device cpu` on the same windows (EVAL_TOKENS, default 8,192 positions: 16 windows of
#           512); a table of both means ± SE per candidate, their difference in SEs, the GPU noise
#           floor (bf16 vs bf16, another batch composition) and each candidate's KLD as a multiple
#           of it. TP=N (N GPUs visible) also runs the GPU
#           evaluation at --tp-size N.
#   tput    positions scored per second on each TPUT_CONFIGS shape (default llama-3.1-8b; e.g.
#           "llama-3.1-8b moonlight-16b-a3b") with random weights in the stored format
#           (strata_bench_make_checkpoint), MAX_TOKENS (default 100,000) positions, fp8_e4m3 and
#           the noise floor, 16 windows of 1,024 per forward; capped at TPUT_SECONDS (default 120),
#           progress and ETA in $OUT/tput.log.
# Logs in $OUT. Under 5 minutes after the build.
set -u
source bench/cuda/device_env.sh  # OUT, C, PKG, dev_configure, dev_build
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
t0=$(date +%s)
dev_configure
dev_build strata strata_parity_test strata_bench_make_checkpoint
echo "build: $(( $(date +%s) - t0 )) s"
M=$C/shared/models
DATA=$C/shared/data/heldout.jsonl
W=/tmp/eval_kv_run
mkdir -p "$W"
TP=${TP:-1}
EVAL_TOKENS=${EVAL_TOKENS:-8192}

# eval-kv NAME DEVICE MODEL ARGS...: one run, its records as JSON in $W/NAME.json.
evalkv() {
  local name=$1 device=$2 model=$3
  shift 3
  local t1=$(date +%s)
  ./build-dev/strata eval-kv --device "$device" --model-path "$model" --data "$DATA" --max-tokens "$EVAL_TOKENS" \
    --context-len 512 --chunk 128 --free-run-prompts 8 --free-run-tokens 32 --no-save-records \
    --json "$W/$name.json" "$@" >"$OUT/$name.log" 2>&1
  echo "  $name: rc $? in $(( $(date +%s) - t1 )) s"
  grep -E "error|Error|CHECK" "$OUT/$name.log" | head -3
}

# The CPU and GPU records of one run side by side.
compare() {  # CPU_JSON GPU_JSON
  python3 - "$1" "$2" <<'PY'
import json, math, sys
def load(p):
    try:
        j = json.load(open(p))
    except Exception as e:
        print(f"  cannot read {p}: {e}"); return {}
    return {r["label"]: r for r in (j if isinstance(j, list) else [j])}
cpu, gpu = load(sys.argv[1]), load(sys.argv[2])
for label, g in gpu.items():
    c = cpu.get(label)
    gk, gn = g["metrics"]["kld"], g.get("noise_floor", {}).get("kld", {})
    line = f"  {label[:40]:<40} gpu KLD {gk['mean']:.3e} ± {gk['se']:.1e}"
    if gn:
        line += f" (noise floor {gn['mean']:.2e} ± {gn['se']:.1e}, {g.get('kld_vs_noise_floor') or float('nan'):.1f}x)"
    if c:
        ck = c["metrics"]["kld"]
        se = math.hypot(ck["se"], gk["se"])
        d = (gk["mean"] - ck["mean"]) / se if se > 0 else float("inf")
        line += f" | cpu {ck['mean']:.3e} ± {ck['se']:.1e} (noise floor {c.get('noise_floor',{}).get('kld',{}).get('mean',float('nan')):.2e}) | diff {d:+.2f} SE {'OK' if abs(d) <= 2 else 'DIFFERS'}"
        line += f" | top-1 gpu {g['metrics']['top1']['agree']:.4f} cpu {c['metrics']['top1']['agree']:.4f}"
    else:
        line += " | no cpu record"
    print(line)
PY
}

house() {  # MODEL_NAME RUN ARGS...
  local model=$1 run=$2
  shift 2
  evalkv "${model}_${run}_cpu" cpu "$M/$model" "$@"
  evalkv "${model}_${run}_cuda" cuda "$M/$model" "$@"
  compare "$W/${model}_${run}_cpu.json" "$W/${model}_${run}_cuda.json"
  if [ "$TP" -gt 1 ]; then
    evalkv "${model}_${run}_cuda_tp$TP" cuda "$M/$model" --tp-size "$TP" --tp-allow-uneven "$@"
    echo "  tp $TP against the CPU:"
    compare "$W/${model}_${run}_cpu.json" "$W/${model}_${run}_cuda_tp$TP.json"
  fi
}

for stage in ${STAGES:-parity house tput}; do
  t1=$(date +%s)
  echo "== $stage"
  case $stage in
    parity)
      ./build-dev/strata_parity_test --gtest_filter='CudaLogitStats.*' >"$OUT/parity.log" 2>&1
      echo "  parity: rc $?"
      grep -E "logit_stats:|OK \]|FAILED|Failure|Expected|Which is" "$OUT/parity.log" | head -20 ;;
    house)
      if [ -d "$M/house-llama" ]; then
        house house-llama main --kv-cache-dtype fp8_e4m3,fp8_e5m2 --mixed-bf16-layers 0,7
      else
        echo "  house-llama: not in this carry ($C), skipped (run with .devcarry/cuda)"
      fi
      if [ -d "$M/house-mla" ]; then
        # fp8_flashmla alone: a layout the GPU refused would otherwise take the other candidates with it.
        house house-mla main --kv-cache-dtype fp8_e4m3,fp8_e5m2 --mixed-bf16-layers 0,3
        house house-mla flash --kv-cache-dtype fp8_flashmla
        house house-mla rope --kv-cache-dtype fp8_e4m3 --kv-mla-rope-dtype bf16
      else
        echo "  house-mla: not in this carry ($C), skipped (run with STRATA_CARRY=\$PWD/.devcarry/mla)"
      fi ;;
    tput)
      tok=""
      for m in house-llama house-mla; do [ -d "$M/$m" ] && tok=$M/$m && break; done
      [ -n "$tok" ] || { echo "  tput: no house tokenizer in this carry, skipped"; continue; }
      for shape in ${TPUT_CONFIGS:-llama-3.1-8b}; do
        cfg=$C/shared/configs/$shape/config.json
        [ -f "$cfg" ] || { echo "  tput: no $shape config in this carry, skipped"; continue; }
        ts=$(date +%s)
        ./build-dev/strata_bench_make_checkpoint --config "$cfg" --out "$W/$shape" --tokenizer "$tok" \
          >"$OUT/make_checkpoint_$shape.log" 2>&1
        echo "  random $shape checkpoint: rc $? in $(( $(date +%s) - ts )) s"
        rm -f "$W/tput.ckpt"  # a fresh measurement, not a continuation
        t2=$(date +%s)
        timeout "${TPUT_SECONDS:-120}" ./build-dev/strata eval-kv --device cuda --model-path "$W/$shape" \
          --data "$C/shared/data/prompts-define.jsonl" --allow-repeat --max-tokens "${MAX_TOKENS:-100000}" \
          --context-len 1024 --chunk 256 --batch-windows 16 --kv-cache-dtype fp8_e4m3 --free-run-prompts 0 \
          --no-save-records --json "$W/tput.json" --checkpoint "$W/tput.ckpt" >"$OUT/tput_$shape.log" 2>&1
        rc=$?
        s=$(( $(date +%s) - t2 ))
        echo "  eval-kv $shape: rc $rc in $s s (load included)"
        tr '\r' '\n' <"$OUT/tput_$shape.log" | grep -E "teacher forcing" | tail -2
        grep -E "eval-kv:|error|CHECK" "$OUT/tput_$shape.log" | head -5
        python3 - "$W/tput.json" "$s" "$shape" <<'PY'
import json, sys
try:
    j = json.load(open(sys.argv[1]))
except Exception:
    sys.exit(0)
n = j["metrics"]["tokens"]
print(f"  {sys.argv[3]}: {n} positions x (reference + noise floor + 1 candidate) in {sys.argv[2]} s wall incl. "
      f"load: {n / float(sys.argv[2]):.0f} positions/s; KLD fp8_e4m3 {j['metrics']['kld']['mean']:.3e}, "
      f"noise floor {j['noise_floor']['kld']['mean']:.3e}")
PY
        rm -rf "$W/$shape" "$W/tput.json" "$W/tput.ckpt"
      done
      ;;
  esac
  echo "  ($stage: $(( $(date +%s) - t1 )) s)"
done
echo "total: $(( $(date +%s) - t0 )) s"
