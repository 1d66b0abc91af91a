#!/bin/bash
# Speculative decoding (NGRAM) on the GPU machine, from the repository root (carry .devcarry/cuda):
# (1) house-llama greedy through `strata generate --device cuda`, with and without NGRAM, at
# concurrency 1 and 16: how many outputs are identical (bf16 verify chunks and one-token decodes
# round differently, so exactness on the GPU waits for the deterministic / batch-invariant mode;
# divergence after the first differing token is expected until then), the tok/s, the accept
# length; (2) the offline benchmark, 8B shape on random weights (NGRAM accepts next to nothing
# there: the cost of verify rows), batch 1 and 64, with and without NGRAM. Verify steps replay
# CUDA graphs like decode steps (up to --cuda-graph-max-bs requests). Well under 4 minutes.
#
# STAGE=eagle3 runs EAGLE-3 (issue 26) instead, on house-llama with the committed drafter
# (DRAFTER=DIR: another drafter directory, e.g. the GPU-trained one), prompts the drafter never saw
# (the last 100 of prompts-define.jsonl, the last 50 of prompts-explain.jsonl): (1) with
# --enable-deterministic-inference, greedy outputs with and without EAGLE3 at concurrency 1 (30
# prompts) and 16 (150 prompts) must be identical; the accept length and its histogram at
# (steps 3, topk 1, draft tokens 4); (2) generation tok/s plain vs EAGLE3 with the default kernels
# at concurrency 1 (16 prompts) and 64 (128 prompts), 128 new tokens (ignore_eos), and at 64 in
# deterministic mode with retraction forced by a 4,096-token pool (identical expected); (3) EAGLE3 at
# concurrency 1 with --disable-cuda-graph: verify, observe and draft steps eager instead of
# graphs, the same outputs, accept length and histogram expected. Each run prints the decode log's
# last split of a step (draft / verify / observe ms) and the CUDA graph counts.
# Draft trees (--speculative-eagle-topk > 1): every stage above runs again for each setting of
# TREES (default "3,4,8": steps, topk, draft tokens; e.g. TREES="3,4,8 5,8,32"), beside the chain:
# identical greedy outputs in deterministic mode at concurrency 1 and 16 and at 64 with retraction
# forced by the small pool, tok/s plain vs chain vs
# tree at concurrency 1 and 64, and the tree's graphs-vs-eager outputs (its verify and draft steps
# replay graphs: the tree mask and rope positions are staged metadata, so a graph of a batch size
# serves every tree shape). The stage ends by packing its logs into $OUT/eagle3_logs.tgz (the
# device returns at most 8 files); its summary, a few lines per run, is also
# $OUT/eagle3_summary.txt. The CUDA graph line of each run shows whether tree steps replay
# (captured vs replayed). Under 3 minutes after the build for the default TREES.
# EAGLE3_PARTS=det keeps only the deterministic comparisons (concurrency 1, 16, 64 with
# retraction), skipping the tok/s and eager runs.
set -u
source bench/cuda/device_env.sh  # OUT, C, PKG, dev_configure, dev_build

eagle3_stage() {
  local t0 drafter spec_flags
  t0=$(date +%s)
  # Prompts and outputs (with the job's lock and done files) stay out of $OUT; logs go there.
  W=/tmp/strata_eagle3
  rm -rf $W && mkdir -p $W
  drafter=${DRAFTER:-tests/fixtures/eagle3/house-llama}
  # PARITY=1: also the device top-k op (backend/top_k.h, the drafter's candidates) against the
  # CPU reference, ids exact, and its time beside the download it replaces.
  if [ "${PARITY:-0}" = 1 ]; then
    dev_configure
    dev_build strata strata_parity_test
    timeout 300 ./build-dev/strata_parity_test --gtest_filter='CudaTopK.*' >"$OUT/topk_parity.log" 2>&1
    echo "top-k parity: exit $?; $(grep -cE '^\[       OK' "$OUT/topk_parity.log") ok, $(grep -cE '^\[  FAILED  \] Cuda' "$OUT/topk_parity.log") failed"
    grep -E "top-k of|Failure|Expected|Which is" "$OUT/topk_parity.log" | head -12
  else
    dev_configure -DSTRATA_TESTS=OFF
    dev_build strata
  fi
  echo "build: $(( $(date +%s) - t0 )) s; drafter $drafter"
  python3 - "$C/shared/data" "$W" <<'PY'
import json, sys
data, out = sys.argv[1], sys.argv[2]
define = open(f"{data}/prompts-define.jsonl").read().splitlines()[-100:]
explain = open(f"{data}/prompts-explain.jsonl").read().splitlines()[-50:]
mixed = [x for pair in zip(define[:50], explain) for x in pair] + define[50:]  # 150, interleaved
for name, rows in (("heldout150", mixed), ("heldout30", mixed[:30]), ("heldout16", mixed[:16]),
                   ("heldout128", mixed[:128])):
    open(f"{out}/{name}.jsonl", "w").write("\n".join(rows) + "\n")
PY
  gen() {  # gen NAME INPUT CONCURRENCY SPEC(off|STEPS,TOPK,TOKENS) [flags...]
    local name=$1 input=$2 conc=$3 spec=$4
    shift 4
    local sflags="" steps topk tokens
    if [ "$spec" != off ]; then
      IFS=, read -r steps topk tokens <<<"$spec"
      sflags="--speculative-algorithm EAGLE3 --speculative-draft-model-path $drafter \
        --speculative-num-steps $steps --speculative-eagle-topk $topk \
        --speculative-num-draft-tokens $tokens"
    fi
    local t1=$(date +%s%N)
    # shellcheck disable=SC2086
    ./build-dev/strata generate --device cuda --model-path $C/shared/models/house-llama \
      --input "$W/$input.jsonl" -o "$W/out_$name.jsonl" --max-new-tokens 128 --ignore-eos \
      --temperature 0 --concurrency $conc --mem-fraction-static 0.5 $sflags "$@" \
      >"$OUT/gen_$name.log" 2>&1
    echo "$name: exit $?, $(( ($(date +%s%N) - t1) / 1000000 )) ms (load included); $(grep -o 'generation [0-9.]* tok/s' "$OUT/gen_$name.log" | tail -1); $(grep -o 'accept len [0-9.]* (verifies by accept length: [^)]*)' "$OUT/gen_$name.log" | tail -1)"
    grep -E "error|CHECK|Error" "$OUT/gen_$name.log" | head -3
    # Where an EAGLE3 step's time goes (the decode log's last phase split), and the graphs.
    grep -o "ms per step: .*" "$OUT/gen_$name.log" | tail -1 | sed 's/^/    /'
    grep -o "CUDA graphs: [0-9]* steps recorded.*" "$OUT/gen_$name.log" | tail -1 | sed 's/^/    /'
    grep -o "[0-9]* decode steps without drafts.*" "$OUT/gen_$name.log" | tail -1 | sed 's/^/    /'
  }
  same() {
    python3 - "$W/out_$1.jsonl" "$W/out_$2.jsonl" <<'PY'
import json, sys
def load(p):
    return {r["id"]: r for r in map(json.loads, open(p))}
a, b = load(sys.argv[1]), load(sys.argv[2])
same = sum(a[k]["conversations"] == b.get(k, {}).get("conversations") for k in a)
print(f"identical outputs {sys.argv[1].split('out_')[-1]} vs {sys.argv[2].split('out_')[-1]}: {same}/{len(a)}")
PY
  }
  # The chain, then each tree: name suffix and setting.
  local settings="EAGLE3:3,1,4" tree
  for tree in ${TREES:-3,4,8}; do settings="$settings tree${tree//,/_}:$tree"; done
  local conc input setting sname sval
  for conc in 1 16; do
    input=heldout150
    [ $conc = 1 ] && input=heldout30
    gen det_c${conc}_off $input $conc off --enable-deterministic-inference
    for setting in $settings; do
      sname=${setting%%:*} sval=${setting#*:}
      gen det_c${conc}_$sname $input $conc $sval --enable-deterministic-inference
      same det_c${conc}_off det_c${conc}_$sname
    done
  done
  # Batch 64 with retraction forced by a small pool (issue 26's acceptance: batch 64, retraction):
  # deterministic mode, so both runs must match token for token.
  gen det_c64_retract_off heldout128 64 off --enable-deterministic-inference \
    --max-total-tokens 4096 --schedule-conservativeness 0.05
  grep -h "Retraction:" "$OUT/gen_det_c64_retract_off.log" | sed 's/^/    /'
  for setting in $settings; do
    sname=${setting%%:*} sval=${setting#*:}
    gen det_c64_retract_$sname heldout128 64 $sval --enable-deterministic-inference \
      --max-total-tokens 4096 --schedule-conservativeness 0.05
    same det_c64_retract_off det_c64_retract_$sname
    grep -h "Retraction:" "$OUT/gen_det_c64_retract_$sname.log" | sed 's/^/    /'
  done
  # EAGLE3_PARTS=det: only the deterministic comparisons above (bench/cuda/treeexact_check.sh).
  [ "${EAGLE3_PARTS:-all}" = det ] && settings=""
  for conc in 1 64; do
    [ -z "$settings" ] && break
    input=heldout128
    [ $conc = 1 ] && input=heldout16
    gen tput_c${conc}_off $input $conc off
    for setting in $settings; do
      sname=${setting%%:*} sval=${setting#*:}
      gen tput_c${conc}_$sname $input $conc $sval
      same tput_c${conc}_off tput_c${conc}_$sname
    done
  done
  # Fixed-shape verify (engine/spec/verify_shape.h): every verify pads to num_draft_tokens rows,
  # so the c64 runs' graph lines above should show few captures (one per batch size) and many
  # replays. The automatic off switch, --speculative-batch-size-threshold THRESHOLD (default 16):
  # c64 again with it for the chain and each tree (plain decode steps above it, the drafter
  # keeping up: tok/s near plain's), the outputs against plain's (default kernels: divergence
  # possible), and in deterministic mode with retraction, where they must be identical; each
  # prints its count of plain steps and pad rows.
  local thr=${THRESHOLD:-16}
  for setting in $settings; do
    sname=${setting%%:*} sval=${setting#*:}
    gen tput_c64_${sname}_thr$thr heldout128 64 $sval --speculative-batch-size-threshold $thr
    same tput_c64_off tput_c64_${sname}_thr$thr
    gen det_c64_retract_${sname}_thr$thr heldout128 64 $sval --enable-deterministic-inference \
      --max-total-tokens 4096 --schedule-conservativeness 0.05 --speculative-batch-size-threshold $thr
    same det_c64_retract_off det_c64_retract_${sname}_thr$thr
  done
  # Verify, observe and draft steps replay CUDA graphs (up to --cuda-graph-max-bs requests):
  # eager steps run the same kernels, so the outputs, the accept length and its histogram must be
  # exactly those above (chain and trees alike).
  for setting in $settings; do
    sname=${setting%%:*} sval=${setting#*:}
    gen tput_c1_${sname}_eager heldout16 1 $sval --disable-cuda-graph
    same tput_c1_$sname tput_c1_${sname}_eager
  done
  echo "total: $(( $(date +%s) - t0 )) s"
  # One file back from the device: the logs, packed.
  tar czf "$OUT/eagle3_logs.tgz" -C "$OUT" $(cd "$OUT" && ls *.log) && (cd "$OUT" && rm -f *.log)
}
if [ "${STAGE:-ngram}" = eagle3 ]; then
  # The summary also as a file: the device returns only the last 12,000 characters of stdout.
  eagle3_stage 2>&1 | tee "$OUT/eagle3_summary.txt"
  exit 0
fi

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
