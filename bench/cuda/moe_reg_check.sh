#!/bin/bash
# The INT4 experts through the register GEMV's experts mode (issue 23/24: MoE decode at a few
# assignments) and the MLA wgmma kernels' open chunks (issue 22), on the GPU machine from the
# repository root (carry .devcarry/cuda):
#   (1) parity: MoE experts / backend layer / INT4 linears, the MLA attention suite (wgmma
#       kernels with causal rows and draft trees);
#   (2) one Kimi-K2.5 rank of tp 8 (INT4 g32 experts, bf16 KV, context 4,096): the decode step
#       as a CUDA graph at batch 1, 2, 8, 32 and 128 on 2- and 4-layer cuts, projected to 61 layers (as
#       decode_profile.sh's kimi stage: 7.393 ms at batch 1 before, 2026-12-02 11:00), with the
#       rank_step_bench variants (KIMI_VARIANTS: the grouped MoE GEMV, cuBLAS per-head, unfused);
#   (3) Moonlight with INT4 g32 experts, batch 1 and 2, register path vs the grouped GEMV;
#   (4) mla_bench acceptance (128 heads: 234 TFLOP/s before; 16 / 8 heads unchanged expected).
# Logs packed into $OUT/moe_reg_check.tgz.
set -u
source bench/cuda/device_env.sh
t0=$(date +%s)
dev_configure
dev_build strata_parity_test strata_bench_rank_step_bench strata_bench_mla_bench
echo "build: $(( $(date +%s) - t0 )) s"
L=$OUT/moe_reg_check
mkdir -p $L
dev_parity moe 'MoeParity.*:MoeBackend.*:Int4Parity.*' ${MOE_PARITY_S:-150}
dev_parity mla 'MlaAttention.*' ${MLA_PARITY_S:-120}
W=/tmp/moe_reg_check
for n in 2 4; do
  python3 bench/cuda/rank_cuts.py cut "$C/shared/configs/kimi-k2.5/config.json" $n "$W/kimi$n"
  timeout 150 ./build-dev/strata_bench_rank_step_bench --config "$W/kimi$n/config.json" --tp-size 8 \
    --batches ${KIMI_BATCHES:-1,2,8,32,128} --context 4096 --prefill 0 --reps 10 \
    --variants ${KIMI_VARIANTS:-moe_grouped,cublas_heads,unfused} >"$L/kimi$n.log" 2>&1
  echo "kimi $n layers: exit $?"
done
# Each step (the default and every variant) projected to 61 layers from the 2- and 4-layer cuts.
python3 bench/cuda/rank_cuts.py project "$L/kimi2.log" "$L/kimi4.log"
# Moonlight-16B-A3B with INT4 g32 experts (Kimi-K2.5's quantization_config on Moonlight's config,
# as deepseek_e2e_run.sh's moonlight_w4a16), all 27 layers at tp 1, batch 1 and 2.
python3 - "$C/shared/configs" "$W/moonlight-w4a16" <<'PY'
import json, os, sys
m = json.load(open(f"{sys.argv[1]}/moonlight-16b-a3b/config.json"))
k = json.load(open(f"{sys.argv[1]}/kimi-k2.5/config.json"))
m["quantization_config"] = k.get("quantization_config") or k["text_config"]["quantization_config"]
os.makedirs(sys.argv[2], exist_ok=True)
json.dump(m, open(f"{sys.argv[2]}/config.json", "w"))
PY
timeout 150 ./build-dev/strata_bench_rank_step_bench --config "$W/moonlight-w4a16/config.json" \
  --batches 1,2 --context 768 --prefill 0 --reps 20 --variants moe_grouped >"$L/moonlight_w4a16.log" 2>&1
echo "moonlight w4a16: exit $?"
grep -E "^model|^decode|^variant" "$L/moonlight_w4a16.log" | cut -c1-150
timeout ${MLA_BENCH_S:-80} ./build-dev/strata_bench_mla_bench --what ceilings,acceptance >"$L/mla_accept.log" 2>&1
echo "mla_bench acceptance: exit $?"
grep -E "^ceiling|^mla " "$L/mla_accept.log" | sed -E 's/ +[0-9]+ split\(s\)//' | head -16
tar czf "$OUT/moe_reg_check.tgz" -C "$OUT" moe_reg_check && rm -rf "$L"
echo "total: $(( $(date +%s) - t0 )) s"
