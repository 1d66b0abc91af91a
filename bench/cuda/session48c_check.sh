#!/bin/bash
# Session 48's third device call: why the merged rope + decode launch (decode_rope_fusion) ends
# ~10 us after the QKV projection where qkv_rope + decode end ~4.5 us after it (session48b's
# timeline, H100). Built on the GPU machine; carry .devcarry/bench. ncu over one Llama-3.1-8B W4A16
# batch-1 graph step's attention kernels (graph nodes profiled one at a time: no PDL overlap, so
# each kernel's own duration), the merged instance under the variant, the defaults' two beside it:
# details (speed of light, warp states, launch) and the SASS lines with their stall samples.
set -u
STRATA_CARRY=$PWD/.devcarry/bench source bench/cuda/device_env.sh
dev_begin strata_bench_kit
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
echo "ncu: ${NCU:-not found}"
RS="./build-dev/strata_bench_kit rank_step_bench --config $C/shared/configs/llama-3.1-8b-w4a16/config.json --batches 1 --context 512 --prefill 0 --reps 3"
prof() {  # NAME REGEX COUNT VARIANTS
  timeout 200 "$NCU" --kernel-name-base demangled --kernel-name "regex:$2" --launch-skip 40 --launch-count "$3" \
    --section SpeedOfLight --section WarpStateStats --section SourceCounters --section LaunchStats \
    --section MemoryWorkloadAnalysis --section SchedulerStats -o "$OUT/$1" -f $RS --variants "$4" >"$OUT/$1_run.log" 2>&1
  echo "ncu $1: rc $?"
  "$NCU" --import "$OUT/$1.ncu-rep" --page details >"$OUT/$1_details.txt" 2>&1
  "$NCU" --import "$OUT/$1.ncu-rep" --page source --print-source sass --csv >"$OUT/$1_sass.csv" 2>&1
  grep -E "decode_kernel|qkv_rope|Duration|Warp Cycles Per Issued|Registers Per|Stack Size|Local Memory|Executed Ipc A|Issue Slots Busy" "$OUT/$1_details.txt" | head -40
}
prof fused "decode_kernel<.int.128, .int.0, .int.2>" 2 decode_rope_fusion
prof plain "decode_kernel<.int.128, .int.0, .int.1>|qkv_rope_kernel" 4 defaults
echo "[session48c_check total @$(( $(date +%s) - t0 )) s]"
rm -f "$OUT"/*.ncu-rep
