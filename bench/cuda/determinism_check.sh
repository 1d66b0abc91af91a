#!/bin/bash
# Deterministic (batch-invariant) inference on the GPU: --enable-deterministic-inference against
# the default kernels. From the repository root on the GPU machine, carrying both house models
# (bash bench/cuda/make_carry.sh all; carry .devcarry/all). Under 4 minutes with the build; logs
# in $OUT. Runs unattended: every step has a timeout and the summary is printed whatever failed.
#   1. strata_bench_determinism_check on house-llama and house-mla (determinism_check.cc): the
#      batch-invariant GEMM against the default kernels (close; a row equal to itself alone),
#      logits rows of 64 sequences alone / in a batch of 64 / reversed on other pages with
#      16-token prefill chunks / beside other sequences' decode with 5-token chunks / decode
#      positions computed by prefill -> bitwise equal in the mode (and the count that differs
#      without it), the CPU reference's own invariance, and greedy 64 x 512 tokens through the
#      engine under two batch compositions -> identical in the mode.
#      The logits schedules also on five tiny fixtures (biases, q/k norms, head_dim 16, MLA + MoE,
#      INT4 experts).
#   2. The mode's throughput cost: offline_bench at the 8B shape (random weights, the checkpoint
#      written at run time) with and without the mode: engine output tok/s, and one decode step
#      at batch 64 x 1,024 context.
# Usage: bash bench/cuda/determinism_check.sh   (env: GEN_TOKENS=512 SKIP_OFFLINE=0)
# The KV-checkpoint kill/resume check in the mode (expects 64/64 identical):
#   GEN_FLAGS=--enable-deterministic-inference bash bench/cuda/preemption_kv_run.sh
set -u
export STRATA_CARRY=${STRATA_CARRY:-$PWD/.devcarry/all}
if [ ! -d "$STRATA_CARRY/shared" ]; then
  echo "no carry at $STRATA_CARRY: run 'bash bench/cuda/make_carry.sh all' here and carry .devcarry/all"
  exit 2
fi
source bench/cuda/device_env.sh  # OUT, C, PKG, dev_configure, dev_build
t0=$(date +%s)
dev_configure
dev_build strata_bench_determinism_check strata_bench_offline_bench
echo "build: $(( $(date +%s) - t0 )) s" | tee "$OUT/summary.log"
GEN_TOKENS=${GEN_TOKENS:-512}

status=0
for m in house-llama house-mla; do
  extra=""
  [ "$m" = house-mla ] && extra="--skip-kernel 1"  # the GEMM check once is enough
  timeout 150 build-dev/strata_bench_determinism_check --model "$C/shared/models/$m" \
    --gen-tokens "$GEN_TOKENS" $extra >"$OUT/determinism_$m.log" 2>&1
  rc=$?
  echo "determinism_check $m: exit status $rc ($(( $(date +%s) - t0 )) s)" | tee -a "$OUT/summary.log"
  [ $rc -ne 0 ] && status=1
  grep -E "^(PASS|FAIL)|differ|identical|against the CPU|failed checks" "$OUT/determinism_$m.log" \
    | sed "s|$C/shared/models/||" | tee -a "$OUT/summary.log"
  [ $rc -ne 0 ] && tail -20 "$OUT/determinism_$m.log"
done

# The tiny fixtures (logits schedules only): biases (qwen2), q/k norms (qwen3), head_dim 16, MLA
# with MoE, and INT4-packed experts (the MoE GEMM's dequantizing path).
for f in llama-gqa qwen2-bias qwen3-qknorm deepseek-v2lite-style deepseek-v3-int4-experts; do
  timeout 60 build-dev/strata_bench_determinism_check --model "$C/shared/fixtures/tiny/$f" \
    --skip-kernel 1 --skip-engine 1 >"$OUT/determinism_tiny_$f.log" 2>&1
  rc=$?
  [ $rc -ne 0 ] && status=1
  echo "determinism_check tiny/$f: exit status $rc; $(grep -c '^PASS' "$OUT/determinism_tiny_$f.log") passed," \
    "$(grep -c '^FAIL' "$OUT/determinism_tiny_$f.log") failed" | tee -a "$OUT/summary.log"
  grep -E "^FAIL|default .*differ" "$OUT/determinism_tiny_$f.log" | sed "s|$C/shared/fixtures/||" \
    | head -6 | tee -a "$OUT/summary.log"
  [ $rc -ne 0 ] && tail -5 "$OUT/determinism_tiny_$f.log"
done

if [ "${SKIP_OFFLINE:-0}" != 1 ]; then
  for det in 0 1; do
    timeout 110 build-dev/strata_bench_offline_bench --prompts 512 --in 512 --out 128 \
      --max-seconds 20 --breakdown-batch 64 --breakdown-context 1024 \
      --enable-deterministic-inference $det >"$OUT/offline_det$det.log" 2>&1
    echo "offline_bench deterministic=$det: exit status $? ($(( $(date +%s) - t0 )) s)" | tee -a "$OUT/summary.log"
    grep -E "^offline|forward|step" "$OUT/offline_det$det.log" | head -8 | tee -a "$OUT/summary.log"
  done
fi
echo "total: $(( $(date +%s) - t0 )) s; determinism checks $([ $status = 0 ] && echo passed || echo FAILED)" \
  | tee -a "$OUT/summary.log"
exit $status
