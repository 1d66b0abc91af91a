#!/bin/bash
# The INT4 experts through the register GEMV's experts mode (issue 23/24: MoE decode at a few
# assignments) and the MLA wgmma kernels' open chunks (issue 22), on the GPU machine from the
# repository root (carry .devcarry/cuda):
#   (1) parity: MoE experts / backend layer / INT4 linears, the MLA attention suite (wgmma
#       kernels with causal rows and draft trees);
#   (2) one Kimi-K2.5 rank of tp 8 (INT4 g32 experts, bf16 KV, context 4,096): the decode step
#       as a CUDA graph at batch 1, 2 and 8 on 2- and 4-layer cuts, projected to 61 layers (as
#       decode_profile.sh's kimi stage: 7.393 ms at batch 1 before, 2026-12-02 11:00);
#   (3) mla_bench acceptance (128 heads: 234 TFLOP/s before; 16 / 8 heads unchanged expected).
# Logs packed into $OUT/moe_reg_check.tgz.
set -u
source bench/cuda/device_env.sh
t0=$(date +%s)
dev_configure
dev_build strata_parity_test strata_bench_rank_step_bench strata_bench_mla_bench
echo "build: $(( $(date +%s) - t0 )) s"
L=$OUT/moe_reg_check
mkdir -p $L
parity() {  # NAME FILTER TIMEOUT
  local t1=$(date +%s)
  timeout "$3" ./build-dev/strata_parity_test --gtest_filter="$2" >"$L/parity_$1.log" 2>&1
  echo "parity $1: exit $?, $(( $(date +%s) - t1 )) s; $(grep -c '^\[       OK \]' "$L/parity_$1.log") ok;" \
    "$(grep -E '^\[  (PASSED|FAILED)  \]' "$L/parity_$1.log" | tr '\n' ' ')"
  grep -E "^\[  FAILED  \]|Failure$" "$L/parity_$1.log" | head -8
}
parity moe 'MoeParity.*:MoeBackend.*:Int4Parity.*' ${MOE_PARITY_S:-150}
parity mla 'MlaAttention.*' ${MLA_PARITY_S:-120}
W=/tmp/moe_reg_check
for n in 2 4; do
  python3 - "$C/shared/configs/kimi-k2.5/config.json" $n "$W/kimi$n" <<'PY'
import json, os, sys
c = json.load(open(sys.argv[1]))
(c.get("text_config") or c)["num_hidden_layers"] = int(sys.argv[2])
os.makedirs(sys.argv[3], exist_ok=True)
json.dump(c, open(sys.argv[3] + "/config.json", "w"))
PY
  timeout 120 ./build-dev/strata_bench_rank_step_bench --config "$W/kimi$n/config.json" --tp-size 8 \
    --batches 1,2,8 --context 4096 --prefill 0 --reps 10 >"$L/kimi$n.log" 2>&1
  echo "kimi $n layers: exit $?"
done
python3 - "$L/kimi2.log" "$L/kimi4.log" <<'PY'
import re, sys
def walls(path):
    return {int(b): float(ms) for b, ms in re.findall(r"^decode   batch (\d+),.*?step ([\d.]+) ms as a CUDA graph", open(path).read(), re.M)}
a, c = walls(sys.argv[1]), walls(sys.argv[2])
for b in sorted(a):
    if b in c:
        print(f"kimi 61-layer step, batch {b}: {a[b] + (c[b] - a[b]) * 59 / 2:.3f} ms (2 layers {a[b]:.3f}, 4 layers {c[b]:.3f})")
PY
timeout ${MLA_BENCH_S:-80} ./build-dev/strata_bench_mla_bench --what ceilings,acceptance >"$L/mla_accept.log" 2>&1
echo "mla_bench acceptance: exit $?"
grep -E "^ceiling|^mla " "$L/mla_accept.log" | sed -E 's/ +[0-9]+ split\(s\)//' | head -16
tar czf "$OUT/moe_reg_check.tgz" -C "$OUT" moe_reg_check && rm -rf "$L"
echo "total: $(( $(date +%s) - t0 )) s"
