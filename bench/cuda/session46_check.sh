#!/bin/bash
# Session 46's first call (carry .devcarry/k56 — strata_parity_test and strata_bench_kit at main
# with CudaTunables::decode_early_kv, off by default — and .devcarry/fxs; the tree slimmed as
# make_carry.sh says): what sessions 43-45 owe, and decode attention's early copies of old keys.
#   1. parity with every default of sessions 44-45: Int4AddNorm.* and the norm / W4A16 suites, the
#      MoE / DeepSeek fixture suites; CudaParity.DecodeAttention* (DecodeAttentionEarlyKv: new);
#   2. Llama-3.1-8B W4A16 and bf16 at batch 1: the defaults against decode_early_kv (and W4A16
#      against no_int4_add_norm), each twice in one process;
#   3. on an H200 (none came in sessions 44-45): mla_h200_ab.sh — the MLA decode defaults (L2
#      prefetch, two S groups) against their alternatives, and a Kimi-K2.5 rank and Moonlight at
#      batch 1 with every default.
set -u
source bench/cuda/prebuilt.sh
prebuilt_begin "${PREBUILT:-k56}" "$PWD/.devcarry/fxs" || exit 1
L=$OUT BIN=$PB
STRATA_CARRY=$PWD/.devcarry/fxs source bench/cuda/device_env.sh  # dev_parity
dev_parity add_norm "Int4AddNorm.*:GemvNorm.*:CudaParity.RmsNorm*:Int4Parity.*:QuantLinear.*:CudaParity.DecodeAttention*" 180
dev_parity moe "MoeParity.*:MoeBackend.*:SideBranch.*:MoeCombineNorm.*:MoeDownCombine.*:*QuantModel*:Fixtures/MlaModel.*/deepseek*-*HouseMla*:*house_mla*" 240
echo "[parity @$(( $(date +%s) - t0 )) s]"
for cfg in llama-3.1-8b-w4a16 llama-3.1-8b; do
  v=decode_early_kv,defaults,decode_early_kv,defaults
  [ $cfg = llama-3.1-8b ] || v=$v,no_int4_add_norm,defaults,no_int4_add_norm
  OUT=$OUT/$cfg STRATA_CARRY=$PWD/.devcarry/fxs PREBUILT=${PREBUILT:-k56} STAGES=llama \
    LLAMA_CONFIG=$cfg LLAMA_VARIANTS=$v \
    bash bench/cuda/session10_check.sh 2>&1 | grep -E "^decode|^variant" | sed "s/^/$cfg /" | cut -c1-120
done
if [[ $gpu == *H200* ]]; then
  OUT=$OUT/mla PREBUILT=${PREBUILT:-k56} bash bench/cuda/mla_h200_ab.sh 2>&1 | grep -v "NMSE" |
    grep -E "^ceiling|^acc|^pf0|^mla|^kimi 61|^decode|^variant|^\[" | cut -c1-200
fi
echo "[session46_check total @$(( $(date +%s) - t0 )) s]"
