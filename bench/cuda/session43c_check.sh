#!/bin/bash
# Session 43's third call (carry .devcarry/k43c — strata_parity_test and strata_bench_kit with
# decode attention's split merge in its last block, CudaTunables::decode_fused_merge_max_splits,
# off by default — and .devcarry/fxs): the attention and tiny Llama W4A16 suites with it (token-
# by-token steps reuse the counters), then the Llama-3.1-8B W4A16 and bf16 steps at batch 1 with
# merges up to 8 and 64 splits against the merge kernel, two processes each (the second with
# the W4A16 step's timeline, CUPTI). On an H200 also the readings main owes (owed_h200_check.sh).
set -u
OUT=${OUT:-/tmp/strata_out}
mkdir -p "$OUT"
t0=$(date +%s)
PREBUILT=${PREBUILT:-k43c}
source bench/cuda/prebuilt.sh unpack "$PREBUILT" || exit 1
prebuilt_link_shared "$PWD/.devcarry/fxs"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader)
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
L=$OUT BIN=$PB
STRATA_CARRY=$PWD/.devcarry/fxs source bench/cuda/device_env.sh  # dev_parity
dev_parity attn "${PARITY_FILTER:-CudaParity.DecodeAttention*:KvFp8.DecodeAttention:*QuantModel*:MlaAttention.DecodeFusedMerge:MlaBackend.*}" ${PARITY_TIMEOUT:-200}
grep -E "decode_fused_merge|llama_w4a16" "$OUT/parity_attn.log" | cut -c1-200 | head -12
V=${VARIANTS:-decode_fused_merge8,decode_fused_merge64}
for cfg in llama-3.1-8b-w4a16 llama-3.1-8b; do
  for i in 1 2; do
    extra=""
    [ "$i" = 2 ] && [ "$cfg" = llama-3.1-8b-w4a16 ] && extra="--timeline 1 --timeline-variants decode_fused_merge8"
    OUT=$OUT/$cfg-$i RANK_EXTRA="$extra" STRATA_CARRY=$PWD/.devcarry/fxs PREBUILT=$PREBUILT \
      STAGES=llama LLAMA_CONFIG=$cfg LLAMA_VARIANTS=$V bash bench/cuda/session10_check.sh 2>&1 |
      grep -E "^decode|^variant|^timeline|attention|combine|merge" | cut -c1-200
    echo "[$cfg $i @$(( $(date +%s) - t0 )) s]"
  done
done
if [[ $gpu == *H200* ]]; then
  LLAMA_CONFIG=llama-3.1-8b-w4a16 CARRY=$PWD/.devcarry/fxs MLA_RUNS=2 PREBUILT=$PREBUILT \
    STEP_STAGES="kimi moonlight" KIMI_BATCHES=1 MOE_RUNS=1 bash bench/cuda/owed_h200_check.sh
fi
echo "[session43c_check total @$(( $(date +%s) - t0 )) s]"
