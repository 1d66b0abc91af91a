#!/bin/bash
# The INT4 experts' gate_up unrounded: the register GEMV's (CudaTunables::moe_int4_gate_up_round,
# off by default since session 42; session 41 ran it with the flat down's unrounded form too, since
# dropped: bench/results/2026-12-06-session41-flat-down-unrounded.patch) and the split gate_up's
# at group 32 (moe_int4_split_round). The MoE, INT4 and DeepSeek fixture suites against the CPU
# twin and the Hugging Face references, then one Kimi-K2.5 rank's experts through the backend at
# 1-128 tokens with the variants beside the defaults in one process (alternating), twice. From
# binaries built and packed on the CPU machine (no build here):
#   here:   bash bench/cuda/prebuilt.sh pack k42 strata_parity_test strata_bench_kit
#           bash bench/cuda/make_carry.sh fxs     (with the tracked tree 61.6 MB of the 67.1 a call)
#   device: (carry .devcarry/k42 and .devcarry/fxs)  bash bench/cuda/unrounded_check.sh
# PREBUILT names the pack; PARITY_FILTER overrides the suites; MOE_DECODE_VARIANTS the forms timed,
# MOE_DECODE_RUNS the processes (2).
set -u
OUT=${OUT:-/tmp/strata_out}
mkdir -p "$OUT"
t0=$(date +%s)
source bench/cuda/prebuilt.sh unpack "${PREBUILT:-k42}" || exit 1
prebuilt_link_shared "$PWD/.devcarry/fxs"  # the fixtures, and shared/configs for moe_bench
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
L=$OUT BIN=$PB
STRATA_CARRY=$PWD/.devcarry/fxs source bench/cuda/device_env.sh  # dev_parity
dev_parity moe "${PARITY_FILTER:-MoeParity.*:MoeBackend.*:Int4Parity.*:*MoeModel*:MoeCombineNorm.*:SideBranch.*:Fixtures/MlaModel.*/deepseek*:*QuantModel*-*HouseMla*:*house_mla*}" ${PARITY_TIMEOUT:-280}
grep -E "^gate_up round .* T (3|17|32):" "$OUT/parity_moe.log" | cut -c1-160 | head -36
for i in $(seq 1 "${MOE_DECODE_RUNS:-2}"); do
  timeout 110 "$PB/strata_bench_moe_bench" --what backend --backend-configs kimi \
    --tokens 1,2,4,8,32,128 \
    --variants "${MOE_DECODE_VARIANTS:-moe_gu_rounded,moe_split_unrounded}" \
    >"$OUT/moe_decode_$i.log" 2>&1
  echo "[moe decode $i @$(( $(date +%s) - t0 )) s] exit $?"
  grep -E "^(backend|variant) +kimi" "$OUT/moe_decode_$i.log" | sed -E 's/ \| router.*//' | cut -c1-170
done
echo "total: $(( $(date +%s) - t0 )) s"
