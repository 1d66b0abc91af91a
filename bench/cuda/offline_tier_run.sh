#!/bin/bash
# Offline throughput with and without the host KV tier (issue 6), on the GPU machine from the
# repository root (carry .devcarry/cuda): strata_bench_offline_bench (1,000 x 1,024 / 1,024, 8B
# shape) for each argument list in RUNS (one per line; default: fp8_e4m3 KV with the tier, the same
# without it, bf16 KV with the tier), STRATA_STEP_TIMING=1, progress every 10 s. PARITY_FILTER
# (default CudaFusedParity.*) runs strata_parity_test first. During each run nvidia-smi samples the
# SM clock, power and throttle reasons once a second ($OUT/smi_K.csv); a line per run summarizes
# them (sustained runs sit at the board's power limit, and the SM clock drops below its maximum).
set -u
source bench/cuda/device_env.sh  # OUT, C, PKG, dev_configure, dev_build
t0=$(date +%s)
dev_configure
dev_build strata_bench_offline_bench strata_bench_llama_bench strata_parity_test
echo "build: $(( $(date +%s) - t0 )) s"
if [ -n "${PARITY_FILTER-CudaFusedParity.*}" ]; then
  ./build-dev/strata_parity_test --gtest_filter="${PARITY_FILTER-CudaFusedParity.*}" >"$OUT/parity.log" 2>&1
  echo "parity (rc $?):"; grep -E "^\[  (PASSED|FAILED) |^\[==========\]|FAILED  \]" "$OUT/parity.log"
fi
OB="./build-dev/strata_bench_offline_bench --config $C/shared/configs/llama-3.1-8b/config.json --tokenizer $C/shared/models/house-llama --breakdown-batch 0"
TIER="--hicache-ratio 0.2 --hicache-write-policy write_back"
RUNS=${RUNS:-"--kv-cache-dtype fp8_e4m3 --mem-fraction 0.92 --schedule-conservativeness 1.5 $TIER
--kv-cache-dtype fp8_e4m3 --mem-fraction 0.92 --schedule-conservativeness 1.5
--mem-fraction 0.92 $TIER"}
k=0
while IFS= read -r args; do
  [ -z "$args" ] && continue
  k=$((k + 1))
  nvidia-smi --query-gpu=clocks.sm,power.draw,clocks_throttle_reasons.active --format=csv,noheader,nounits \
    -lms 1000 >"$OUT/smi_$k.csv" &
  smi=$!
  STRATA_STEP_TIMING=1 $OB $args >"$OUT/offline_$k.log" 2>&1
  rc=$?
  kill $smi
  echo "offline $args (rc $rc):"
  grep -E "^engine|^progress|^offline|^step|Host KV tier|CUDA graphs|engine steps|eager steps" "$OUT/offline_$k.log" | sed "s/^/  /" | cut -c1-330 | tail -40
  # Samples drawing over 300 W (the run's busy part): SM clock and power medians, and how many
  # had the software power cap (throttle reason bit 0x4) active.
  python3 - "$OUT/smi_$k.csv" <<'PY'
import statistics, sys
rows = [l.split(", ") for l in open(sys.argv[1]) if l.count(",") == 2]
busy = [(int(c), float(p), int(t, 16)) for c, p, t in rows if float(p) > 300]
if not busy:
    print("  smi: no busy samples")
else:
    clk = [b[0] for b in busy]
    print(f"  smi: {len(busy)} busy s, SM clock median {statistics.median(clk):.0f} MHz (min {min(clk)}, "
          f"max {max(clk)}), power median {statistics.median(b[1] for b in busy):.0f} W, "
          f"power cap active {sum(1 for b in busy if b[2] & 4)} of {len(busy)} s")
PY
done <<<"$RUNS"
echo "total: $(( $(date +%s) - t0 )) s"
