#!/bin/bash
# Checkpoint loading on the GPU machine (bench/load_bench.cc), from the repository root,
# `.devcarry/cuda` carried (debs, shared/configs). Sparse zero checkpoints (no disk space; the
# kernel zero-fills page-cache pages as a fast disk would fill them) loaded through the real
# loader onto the CUDA backend, and onto the host-only sink (what the host side reaches alone with
# this machine's cores), after the upload parity tests (device bytes = the host's bytes).
#
#   parity         WeightUpload.* (exact bytes of the staged uploads), QuantLinear / QuantWeightBytes
#                  (packed uploads vs the CPU twin, the planner's bytes), MoeBackend.ExpertsMatchCpu
#                  (bf16 / fp8 / INT4 expert stacks), CudaModel (house-llama, dense bf16 weights)
#   moonlight      Moonlight-16B-A3B bf16 (32 GB), cuda x2 (the second from a warm page cache), sink x1
#   w4a16          the same with Kimi-K2.5's INT4 quantization_config (11 GB), cuda x2
#   kimi           Kimi-K2.5, rank 0 of tp 8 alone, the first KIMI_LAYERS layers (default 20 of 61:
#                  the rank's bytes scale with the layers), cuda x1
# Stages: STAGES (default "parity moonlight w4a16 kimi"). Logs in $OUT. About 3 minutes after
# the build.
set -u
source bench/cuda/device_env.sh
t0=$(date +%s)
dev_configure
dev_build strata_bench_load_bench strata_parity_test
echo "build: $(( $(date +%s) - t0 )) s"
CFG=$C/shared/configs
LB=./build-dev/strata_bench_load_bench
nproc
free -g | head -2
df -h /tmp | tail -1

load() {  # NAME ARGS...
  local name=$1
  shift
  timeout 240 $LB "$@" >"$OUT/load_$name.log" 2>&1
  echo "$name: rc $?"
  grep -E "^load|^checkpoint|^device pool|error|CHECK" "$OUT/load_$name.log" | head -6
}

for stage in ${STAGES:-parity moonlight w4a16 kimi}; do
  t1=$(date +%s)
  case $stage in
    parity)
      timeout 300 ./build-dev/strata_parity_test \
        --gtest_filter='WeightUpload.*:QuantLinear.*:QuantWeightBytes.*:MoeBackend.ExpertsMatchCpu:Fixtures/CudaModel.*' \
        >"$OUT/parity_load.log" 2>&1
      echo "parity: rc $?"
      grep -E "^\[  (PASSED|FAILED) |FAILED TEST|^\[       OK|Failure" "$OUT/parity_load.log" | head -30 ;;
    moonlight)
      load moonlight_cuda --config $CFG/moonlight-16b-a3b/config.json --backend cuda --reps 2 --keep --dir /tmp/ld_moon
      load moonlight_sink --config $CFG/moonlight-16b-a3b/config.json --backend sink --reps 1 --dir /tmp/ld_moon ;;
    w4a16)
      load w4a16_cuda --config $CFG/moonlight-16b-a3b/config.json --quant-from $CFG/kimi-k2.5/config.json \
        --backend cuda --reps 2 --dir /tmp/ld_w4 ;;
    kimi)
      load kimi_rank_cuda --config $CFG/kimi-k2.5/config.json --layers ${KIMI_LAYERS:-20} --tp-size 8 \
        --backend cuda --reps 1 --dir /tmp/ld_kimi ;;
  esac
  echo "stage $stage: $(( $(date +%s) - t1 )) s"
done
