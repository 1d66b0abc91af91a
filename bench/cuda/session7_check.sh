#!/bin/bash
# Session 7's integration check (the INT4 experts' knobs, router + route in one launch, the MLA
# inputs in one launch, the per-head GEMV's preload), one build, on the GPU
# machine from the repository root (carry with debs, shared/configs and shared/fixtures:
# STRATA_CARRY=$PWD/.devcarry/fx):
#   (1) parity: each change's new tests first, the MoE, MLA, linear and fused suites around them
#       last, in the time left before DEADLINE_S (PARITY=0 skips; PARITY_FILTER replaces the list);
#   (2) one Kimi-K2.5 rank of tp 8 (INT4 experts, bf16 KV, context 4,096), 2- and 4-layer cuts
#       projected to 61 layers, batches KIMI_BATCHES, default and every KIMI_VARIANTS change;
#   (3) Moonlight bf16 batch 1 (27 layers, context 768), default and every MOONLIGHT_VARIANTS;
#   (4) one MoE layer through the backend (moe_bench --what backend, MOE_CONFIGS at MOE_TOKENS),
#       experts' share of copy bandwidth by default and under each MOE_VARIANTS change.
# Logs packed into $OUT/session7_check.tgz; the summary on stdout.
set -u
source bench/cuda/device_env.sh
t0=$(date +%s)
dev_configure
dev_build strata_bench_moe_bench strata_bench_rank_step_bench
[ "${PARITY:-1}" = 1 ] && dev_build strata_parity_test
echo "build: $(( $(date +%s) - t0 )) s"
L=$OUT/session7_check
mkdir -p $L
pack() { tar czf "$OUT/session7_check.tgz" -C "$OUT" session7_check; }
trap pack EXIT
if [ "${PARITY:-1}" = 1 ]; then
  dev_parity new "${PARITY_NEW:-*MlaInputs*:MlaBackend.DecodeStepsReplayCapturedGraphs:CudaFusedParity.QkvRopeKvWrite:CudaParity.PerHeadLinear}" 100
fi
W=/tmp/session7_check
if [ "${KIMI:-1}" = 1 ]; then
  for n in 2 4; do
    python3 bench/cuda/rank_cuts.py cut "$C/shared/configs/kimi-k2.5/config.json" $n "$W/kimi$n"
    timeout 150 ./build-dev/strata_bench_rank_step_bench --config "$W/kimi$n/config.json" --tp-size 8 \
      --batches ${KIMI_BATCHES:-1,32,128} --context 4096 --prefill 0 --reps ${KIMI_REPS:-10} \
      --variants ${KIMI_VARIANTS:-unfused} >"$L/kimi$n.log" 2>&1
    echo "kimi $n layers: exit $?"
  done
  python3 bench/cuda/rank_cuts.py project "$L/kimi2.log" "$L/kimi4.log"
fi
if [ -n "${MOONLIGHT_VARIANTS:-}" ]; then
  timeout 100 ./build-dev/strata_bench_rank_step_bench --config "$C/shared/configs/moonlight-16b-a3b/config.json" \
    --batches 1 --context 768 --prefill 0 --reps ${MOONLIGHT_REPS:-20} --variants "$MOONLIGHT_VARIANTS" >"$L/moonlight.log" 2>&1
  echo "moonlight: exit $?"
  grep -E "^decode|^variant" "$L/moonlight.log" | cut -c1-150
fi
if [ -n "${MOE_VARIANTS:-}" ]; then
  timeout 100 ./build-dev/strata_bench_moe_bench --what backend --backend-configs ${MOE_CONFIGS:-kimi} \
    --tokens ${MOE_TOKENS:-1,8,32,128} --variants "$MOE_VARIANTS" >"$L/moe_backend.log" 2>&1
  echo "moe_bench backend: exit $?"
  grep -E "^backend|^variant" "$L/moe_backend.log" | sed -E 's/ \| MoE ops.*//; s/ = [0-9]+ GB\/s = / /g' | cut -c1-170
fi
# The suites last, in the time left before DEADLINE_S (default 570 s after the start).
left=$(( ${DEADLINE_S:-570} - ($(date +%s) - t0) ))
if [ "${PARITY:-1}" = 1 ] && [ $left -gt 20 ]; then
  dev_parity suites "${PARITY_FILTER:-MoeParity.*:MoeBackend.*:MlaBackend.*:*MoeModel*:*MlaModel*:CudaParity.*:CudaFusedParity.*:KvFp8.*:Int4Parity.*:MlaAttention.*}" $left
fi
echo "total: $(( $(date +%s) - t0 )) s"
