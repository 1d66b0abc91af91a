#!/bin/bash
# Session 9's check of the new graph-mode defaults (side branches, the GEMV pair, steps launched in
# segments of 64), one build, on the GPU machine from the repository root (carry
# STRATA_CARRY=$PWD/.devcarry/cuda: debs, shared/{configs,fixtures}, models/house-llama):
#   (1) parity: PARITY_NEW first, then the suites around them (PARITY_FILTER) in the time left;
#   (2) Moonlight bf16 batch 1 (27 layers, context 768) through rank_step_bench, the defaults and
#       MOONLIGHT_VARIANTS (A/B in one process), then through the engine (offline_bench,
#       1 x 512 / 512, greedy: the product's path);
#   (3) the Llama-3.1-8B shape's offline 1,000 x 1,024 / 1,024 (bf16, --mem-fraction 0.92; 9,056
#       tok/s before), LLAMA_OFFLINE=0 skips it;
#   (4) one Kimi-K2.5 rank of tp 8, 2- and 4-layer cuts projected to 61 layers, KIMI_VARIANTS.
# Logs packed into $OUT/session9_check.tgz; the summary on stdout.
set -u
source bench/cuda/device_env.sh
t0=$(date +%s)
dev_configure
dev_build strata_parity_test strata_bench_rank_step_bench strata_bench_offline_bench
echo "build: $(( $(date +%s) - t0 )) s"
L=$OUT/session9_check
mkdir -p $L
pack() { tar czf "$OUT/session9_check.tgz" -C "$OUT" session9_check; }
trap pack EXIT
CFG=$C/shared/configs
dev_parity new "${PARITY_NEW:-Fixtures/MlaModel.GreedyMatchesTheCpuBackend/deepseek*:SideBranch.*:GemvPair.*}" 100
timeout 100 ./build-dev/strata_bench_rank_step_bench --config "$CFG/moonlight-16b-a3b/config.json" \
  --batches 1 --context 768 --prefill 0 --reps 100 --variants "${MOONLIGHT_VARIANTS:-no_segments}" \
  >"$L/moonlight.log" 2>&1
echo "moonlight: exit $?"
grep -E "^decode|^variant" "$L/moonlight.log" | cut -c1-200
grep "CUDA graphs:" "$L/moonlight.log" | cut -c1-260
timeout 120 ./build-dev/strata_bench_offline_bench --config "$CFG/moonlight-16b-a3b/config.json" \
  --tokenizer "$C/shared/models/house-llama" --prompts 1 --in 512 --out 512 --breakdown-batch 0 \
  --max-seconds 60 >"$L/moonlight_engine.log" 2>&1
echo "moonlight engine batch 1: exit $?"
grep -E "^offline|^decode|CUDA graphs:" "$L/moonlight_engine.log" | cut -c1-260
if [ "${LLAMA_OFFLINE:-1}" = 1 ]; then
  timeout 240 ./build-dev/strata_bench_offline_bench --config "$CFG/llama-3.1-8b/config.json" \
    --tokenizer "$C/shared/models/house-llama" --mem-fraction 0.92 --breakdown-batch 0 \
    >"$L/llama_offline.log" 2>&1
  echo "llama 8B offline: exit $?"
  grep -E "^offline|^decode|^prefill|CUDA graphs:" "$L/llama_offline.log" | cut -c1-260
fi
W=/tmp/session9_check
for n in 2 4; do
  python3 bench/cuda/rank_cuts.py cut "$CFG/kimi-k2.5/config.json" $n "$W/kimi$n"
  timeout 150 ./build-dev/strata_bench_rank_step_bench --config "$W/kimi$n/config.json" --tp-size 8 \
    --batches 1,32,128 --context 4096 --prefill 0 --reps 100 --variants ${KIMI_VARIANTS:-no_segments} \
    >"$L/kimi$n.log" 2>&1
  echo "kimi $n layers: exit $?"
done
python3 bench/cuda/rank_cuts.py project "$L/kimi2.log" "$L/kimi4.log"
left=$(( ${DEADLINE_S:-570} - ($(date +%s) - t0) ))
if [ $left -gt 20 ]; then
  dev_parity suites "${PARITY_FILTER:-CudaParity.*:CudaFusedParity.*:MlaBackend.*:MoeBackend.*:MoeParity.*:Fixtures/MlaModel.*/deepseek*:*MoeModel*:*QuantModel*:QuantLinear.*:Int4Parity.*:MlaAttention.*:KvFp8.*:*LlamaModel*:*Fixtures/Model*:*Graph*:*Eagle*}" $left
fi
echo "total: $(( $(date +%s) - t0 )) s"
