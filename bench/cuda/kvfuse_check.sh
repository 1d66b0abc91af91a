#!/bin/bash
# MLA's attention inputs in one launch (issue 22: kv_a -> kv_a_layernorm + rope on k_pe + page
# write; CudaTunables::mla_inputs_fusion, backend/cuda/mla_inputs.h), on the GPU machine, from
# the repository root, STRATA_CARRY=$PWD/.devcarry/mla carried (house-mla and the tiny fixtures).
#
# Stages (STAGES, default "parity kimi moonlight"):
#   parity     *MlaInputs* (the fused launch against the separate launches bit for bit, every KV
#              layout, and whole models' logits and KV bytes), the MLA backend and model tests,
#              the norm / rope / per-head ops the fused launch shares code with, the fp8 KV write
#              (PARITY_FILTER to change them).
#   kimi       one Kimi-K2.5 rank of tp 8 (INT4 experts, bf16 KV, context 4,096) cut to 2 and 4
#              layers, decode at batch 1 and 32 as CUDA graphs: the default against the variants
#              unfused_mla_inputs (this fusion off alone) and unfused (every fusion off), in one
#              process; the walls projected linearly to 61 layers (the difference of the two cuts
#              is two MoE layers, as decode_profile.sh does). The 4-layer cut's per-op profile at
#              batch 1 (launches per step).
#   moonlight  Moonlight-16B-A3B shape, bf16, all 27 layers, batch 1 at context 768, the same A/B.
# Stdout: the summary; every log packed into $OUT/kvfuse.tgz. About 2-3 minutes after the build.
set -u
source bench/cuda/device_env.sh  # OUT, C, PKG, dev_configure, dev_build
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
t0=$(date +%s)
dev_configure
STAGES=${STAGES:-parity kimi moonlight}
dev_build strata_bench_rank_step_bench
case " $STAGES " in *" parity "*) dev_build strata_parity_test ;; esac
echo "build: $(( $(date +%s) - t0 )) s"
CFG=$C/shared/configs
W=/tmp/kvfuse
mkdir -p $W
RS=./build-dev/strata_bench_rank_step_bench
VARIANTS=unfused_mla_inputs,unfused


for stage in $STAGES; do
  t1=$(date +%s)
  case $stage in
    parity)
      F=${PARITY_FILTER:-'*MlaInputs*:MlaBackend.*:*MlaModel*:MlaDcp.*:CudaParity.RmsNormColumns:CudaParity.RmsNormAndResidual:CudaParity.RopeVariants:CudaParity.RopeMergedAtTwoOffsets:CudaParity.PerHeadLinear:KvFp8.KvWriteStoresTheCpuBytes'}
      timeout 300 ./build-dev/strata_parity_test --gtest_filter="$F" >"$OUT/parity.log" 2>&1
      echo "parity: rc $?"
      grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|^\[  SKIPPED|Failure|^mla inputs model" "$OUT/parity.log" | head -40
      echo "MlaInputs op cases run: $(grep -cE '^mla inputs .*nmse vs CPU' "$OUT/parity.log")" ;;
    kimi)
      for L in 2 4; do
        python3 bench/cuda/rank_cuts.py cut "$CFG/kimi-k2.5/config.json" $L "$W/kimi$L"
        prof=0; [ $L = 4 ] && prof=1
        $RS --config "$W/kimi$L/config.json" --tp-size 8 --batches 1,32 --context 4096 --prefill 0 \
          --reps 30 --op-profile $prof --variants $VARIANTS >"$OUT/kimi${L}.log" 2>&1
        echo "kimi $L layers: rc $?"
        grep -E "^decode|^variant" "$OUT/kimi${L}.log"
      done
      python3 bench/cuda/rank_cuts.py project "$OUT/kimi2.log" "$OUT/kimi4.log"
      sed -n '/^profile/,$p' "$OUT/kimi4.log" | head -30 ;;
    moonlight)
      $RS --config "$CFG/moonlight-16b-a3b/config.json" --batches 1 --context 768 --prefill 0 \
        --reps 30 --variants $VARIANTS >"$OUT/moonlight.log" 2>&1
      echo "moonlight: rc $?"
      grep -E "^model|^decode|^variant" "$OUT/moonlight.log" ;;
  esac
  echo "-- $stage: $(( $(date +%s) - t1 )) s"
done
(cd "$OUT" && tar czf kvfuse.tgz --exclude=kvfuse.tgz . && find . -type f ! -name kvfuse.tgz -delete)
ls -la "$OUT"
