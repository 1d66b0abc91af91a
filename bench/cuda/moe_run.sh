#!/bin/bash
# MoE on the GPU (issue 23: src/backend/cuda/moe_route.*, moe_experts*) on the GPU machine, from
# the repository root, `.devcarry/cuda` carried (the debs the configure needs; no model is read):
#   1. build strata_parity_test and strata_bench_moe_bench (Release, build-dev);
#   2. resources: registers / spills / shared memory of the MoE kernels (cuobjdump -res-usage);
#   3. parity: the MoeParity tests, one process each (a CHECK abort in one does not hide the
#      others): RepackLayouts, RouterLogits, RouteMatchesCpu (near-ties counted), Plan (one-CTA
#      and multi-CTA), ExpertsMatchCpu (bf16 / fp8 / int4 g32 / g128, decode and prefill, NMSE
#      per case), GemvShapesMatchCpu (every decode GEMV work shape: k split over warps and over
#      cluster CTAs, row tiles per warp; grouped and dense), GemmShortKMatchCpu (the prefill
#      down projection's x-resident path at 1..16 blocks per CTA and the one-block pipeline),
#      DenseModeMatchesCpu. Logs: $OUT/parity_<test>.log;
#   4. bench: strata_bench_moe_bench (ceilings, then Kimi-K2.5 tp-8 rank int4, Moonlight bf16
#      and W4A16, DeepSeek-V3 tp-8 rank fp8 at 1..8,192 tokens, gate_up and down apart, then
#      "sweep" lines: every decode GEMV shape forced (T <= 32) and the prefill down
#      projection's blocks per CTA; BENCH_ARGS adds flags, e.g. "--configs kimi --tokens 1,32"
#      or "--sweep 0"), log $OUT/bench.log;
#   5. torch: bench/cuda/moe_torch_baseline.py (the PyTorch loop over experts, same shapes), log
#      $OUT/torch.log.
# Stages can be skipped: STAGES="parity bench" (default "resources parity bench torch").
# Run: device tool, carry [".devcarry/cuda"], command `bash bench/cuda/moe_run.sh`; ~4 minutes
# with the build (set STAGES to split it over two calls if the build is slow).
set -u
source bench/cuda/device_env.sh  # OUT, C, PKG, dev_configure, dev_build; carried deps unpacked
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
t0=$(date +%s)
dev_configure
dev_build strata_parity_test strata_bench_moe_bench
echo "build: $(( $(date +%s) - t0 )) s"
for stage in ${STAGES:-resources parity bench torch}; do
  case $stage in
    resources)
      dump=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
      if [ -x "$dump" ]; then
        for o in $(find build-dev -name 'moe_*.cu.o'); do "$dump" -res-usage "$o"; done >"$OUT/resources.txt" 2>&1
        # One line per kernel: REG / STACK / SHARED / LOCAL and its name.
        grep -A1 "Function" "$OUT/resources.txt" | paste - - - 2>/dev/null |
          sed -E 's/.*Function ([^:]*):.*(REG:[0-9]+) (STACK:[0-9]+) (SHARED:[0-9]+) (LOCAL:[0-9]+).*/\2 \3 \4 \5 \1/' |
          sed -E 's/_ZN6strata4cuda[0-9A-Za-z_]*(moe_[a-z_]*kernel)/\1/' | head -60
      else
        echo "resources: no cuobjdump on this image"
      fi ;;
    parity)
      for t in RepackLayouts RouterLogits RouteMatchesCpu Plan ExpertsMatchCpu GemvShapesMatchCpu \
        GemmShortKMatchCpu DenseModeMatchesCpu; do
        t1=$(date +%s)
        timeout ${PARITY_TIMEOUT:-90} ./build-dev/strata_parity_test --gtest_filter="MoeParity.$t" >"$OUT/parity_$t.log" 2>&1
        echo "parity $t: rc $? ($(( $(date +%s) - t1 )) s)"
        grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure|CHECK failed|CUDA: |Expected|Which is|near-ties [1-9]" \
          "$OUT/parity_$t.log" | head -40
      done
      # The NMSE of every expert case, worst first.
      grep -hE "^(experts|dense|gemv|shortk) " "$OUT"/parity_*.log | awk '{print $NF, $0}' | sort -g -r | cut -d' ' -f2- | head -12 ;;
    bench)
      t1=$(date +%s)
      timeout ${BENCH_TIMEOUT:-150} ./build-dev/strata_bench_moe_bench ${BENCH_ARGS:-} >"$OUT/bench.log" 2>&1
      echo "bench: rc $? ($(( $(date +%s) - t1 )) s)"
      grep -E "^(device|ceiling|config|moe |sweep )" "$OUT/bench.log" | head -200 ;;
    torch)
      t1=$(date +%s)
      timeout ${TORCH_TIMEOUT:-90} python3 bench/cuda/moe_torch_baseline.py ${TORCH_ARGS:-} >"$OUT/torch.log" 2>&1
      echo "torch: rc $? ($(( $(date +%s) - t1 )) s)"
      grep -E "^torch" "$OUT/torch.log" | head -40
      tail -3 "$OUT/torch.log" ;;
  esac
done
echo "total: $(( $(date +%s) - t0 )) s"
