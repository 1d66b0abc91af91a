#!/bin/bash
# The MoE router GEMV and expert choice as one launch (issue 24: launch_moe_router_route, merged
# by the CUDA backend's graph mode), on the GPU machine from the repository root (carry
# .devcarry/cuda):
#   (1) parity: the fused launch bitwise against the two launches, the backend's merge
#       (MoeParity.RouterRoute*, MoeBackend.GraphModeMerges*), and the MoE suites it touches
#       (MoeParity.*, MoeBackend.*: routing against the CPU twin, graph replay);
#   (2) one Kimi-K2.5 rank of tp 8 (INT4 g32 experts, bf16 KV, context 4,096): the decode step
#       as a CUDA graph at batch 1, 8, 32 on 2- and 4-layer cuts, projected to 61 layers, with
#       the rank_step_bench variants route_unfused (only this merge off) and unfused (every
#       fusion off) timed in the same process (ROUTE_VARIANTS);
#   (3) moe_bench: the kimi layer's router, route and router+route in one launch (kernels, CUDA
#       graphs of 16 calls) and the backend layer at 1, 8, 32 tokens, ceilings in the same run.
# Logs packed into $OUT/route_check.tgz.
set -u
source bench/cuda/device_env.sh
t0=$(date +%s)
dev_configure
dev_build strata_parity_test strata_bench_rank_step_bench strata_bench_moe_bench
echo "build: $(( $(date +%s) - t0 )) s"
L=$OUT/route_check
mkdir -p $L
dev_parity fused 'MoeParity.RouterRoute*:MoeBackend.GraphModeMerges*' ${FUSED_PARITY_S:-90}
grep -E "^router\+route|^graph-mode" "$L/parity_fused.log" | head -12
dev_parity moe 'MoeParity.*:MoeBackend.*' ${MOE_PARITY_S:-150}
W=/tmp/route_check
for n in 2 4; do
  python3 bench/cuda/rank_cuts.py cut "$C/shared/configs/kimi-k2.5/config.json" $n "$W/kimi$n"
  timeout 150 ./build-dev/strata_bench_rank_step_bench --config "$W/kimi$n/config.json" --tp-size 8 \
    --batches ${KIMI_BATCHES:-1,8,32} --context 4096 --prefill 0 --reps 20 \
    --variants ${ROUTE_VARIANTS:-route_unfused,unfused} >"$L/kimi$n.log" 2>&1
  echo "kimi $n layers: exit $?"
done
# Each step (the default and every variant) projected to 61 layers from the 2- and 4-layer cuts.
python3 bench/cuda/rank_cuts.py project "$L/kimi2.log" "$L/kimi4.log"
timeout ${MOE_BENCH_S:-120} ./build-dev/strata_bench_moe_bench --what kernels,backend --configs kimi \
  --backend-configs kimi --tokens 1,8,32 --sweep 0 >"$L/moe_bench.log" 2>&1
echo "moe_bench: exit $?"
grep -E "^ceiling|router|^backend" "$L/moe_bench.log" | cut -c1-230 | head -12
tar czf "$OUT/route_check.tgz" -C "$OUT" route_check && rm -rf "$L"
echo "total: $(( $(date +%s) - t0 )) s"
