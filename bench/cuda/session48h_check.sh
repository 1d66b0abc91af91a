#!/bin/bash
# Session 48's last call: decode_rope_fusion with every load of the projection's output issued
# before the new row's cache store (one trip to L2 after the PDL wait, not two). Built on the GPU
# machine; carry .devcarry/bench. Parity of the merged launch; Llama-3.1-8B W4A16 and bf16 batch
# 1 with and without the merge, alternating, two processes; ncu of the merged instance alone
# (session48d: 9.15-9.22 us against 7.58 for the plain kernel).
set -u
STRATA_CARRY=$PWD/.devcarry/bench source bench/cuda/device_env.sh
dev_begin strata_parity_test strata_bench_kit
L=$OUT BIN=./build-dev
dev_parity ops "CudaParity.DecodeRopeFusion:CudaParity.DecodeAttention*" 100
CFG=$C/shared/configs
for i in 1 2; do
  for cfg in llama-3.1-8b-w4a16 llama-3.1-8b; do
    timeout 100 ./build-dev/strata_bench_kit rank_step_bench --config "$CFG/$cfg/config.json" --batches 1 \
      --context 512 --prefill 0 --reps 100 \
      --variants no_decode_rope_fusion,defaults,no_decode_rope_fusion,defaults >"$OUT/${cfg}_$i.log" 2>&1
    grep -E "^decode|^variant" "$OUT/${cfg}_$i.log" | sed "s/^/$cfg /" | cut -c1-115
  done
done
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
timeout 100 "$NCU" --kernel-name-base demangled --kernel-name "regex:decode_kernel<.int.128, .int.0, .int.2>" \
  --launch-skip 40 --launch-count 2 --section SpeedOfLight --section WarpStateStats -o "$OUT/fused" -f \
  ./build-dev/strata_bench_kit rank_step_bench --config "$CFG/llama-3.1-8b-w4a16/config.json" --batches 1 \
  --context 512 --prefill 0 --reps 3 >"$OUT/ncu_run.log" 2>&1
"$NCU" --import "$OUT/fused.ncu-rep" --page details 2>&1 | grep -E "Duration|Warp Cycles Per Issued"
rm -f "$OUT"/*.ncu-rep
echo "[session48h_check total @$(( $(date +%s) - t0 )) s]"
