#!/bin/bash
# Session 48's fourth device call: decode_rope_fusion with each pair's (cos, sin) from a table the
# block makes before its PDL wait (one sincosf in the code, not 24 inlined a thread: session48c's
# ncu had the merged instance at 7,944 SASS lines, 61% of its cycles on instruction fetch).
# Built on the GPU machine; carry .devcarry/bench.
#   1. parity: the merged launch's bits (both copy modes) and the rope / fused QKV tests;
#   2. rank_step_bench, Llama-3.1-8B W4A16 and bf16 at batch 1: the defaults beside
#      decode_rope_fusion and decode_rope_late, alternating, twice;
#   3. ncu of the merged instance beside the defaults' decode and qkv_rope (as session48c).
set -u
STRATA_CARRY=$PWD/.devcarry/bench source bench/cuda/device_env.sh
dev_begin strata_parity_test strata_bench_kit
L=$OUT BIN=./build-dev
dev_parity ops "CudaParity.DecodeRopeFusion:CudaParity.DecodeAttention*:CudaFusedParity.*:CudaParity.Rope*" 200
grep "^decode rope fusion" "$OUT/parity_ops.log" | cut -c1-150
CFG=$C/shared/configs
for i in 1 2; do
  for cfg in llama-3.1-8b-w4a16 llama-3.1-8b; do
    timeout 150 ./build-dev/strata_bench_kit rank_step_bench --config "$CFG/$cfg/config.json" --batches 1 \
      --context 512 --prefill 0 --reps 100 \
      --variants decode_rope_fusion,defaults,decode_rope_late,defaults,decode_rope_fusion,defaults \
      >"$OUT/${cfg}_$i.log" 2>&1
    grep -E "^decode|^variant" "$OUT/${cfg}_$i.log" | sed "s/^/$cfg /" | cut -c1-120
  done
  echo "[round $i @$(( $(date +%s) - t0 )) s]"
done
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
RS="./build-dev/strata_bench_kit rank_step_bench --config $CFG/llama-3.1-8b-w4a16/config.json --batches 1 --context 512 --prefill 0 --reps 3"
prof() {  # NAME REGEX COUNT VARIANTS
  timeout 200 "$NCU" --kernel-name-base demangled --kernel-name "regex:$2" --launch-skip 40 --launch-count "$3" \
    --section SpeedOfLight --section WarpStateStats --section SourceCounters --section LaunchStats \
    -o "$OUT/$1" -f $RS --variants "$4" >"$OUT/$1_run.log" 2>&1
  "$NCU" --import "$OUT/$1.ncu-rep" --page details >"$OUT/$1_details.txt" 2>&1
  "$NCU" --import "$OUT/$1.ncu-rep" --page source --print-source sass --csv >"$OUT/$1_sass.csv" 2>&1
  grep -E "^  [a-z].*decode_kernel|^  [a-z].*qkv_rope|Duration|Warp Cycles Per Issued" "$OUT/$1_details.txt" | cut -c1-100 | head -12
}
prof fused "decode_kernel<.int.128, .int.0, .int.2>" 2 decode_rope_fusion
prof plain "decode_kernel<.int.128, .int.0, .int.1>|qkv_rope_kernel" 2 defaults
rm -f "$OUT"/*.ncu-rep
echo "[session48d_check total @$(( $(date +%s) - t0 )) s]"
