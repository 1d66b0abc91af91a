#!/bin/bash
# Tensor-parallel check on a multi-GPU device kind (e.g. nvidia-h200-x2), from the repository root:
# builds strata_parity_test and the offline benchmark, runs the NCCL communicator, tp-vs-tp-1 and
# DCP-on-NCCL-ranks-vs-tp-1 suites (TP_FILTER), the collectives a decode step runs at each size of
# TP_SIZES above 1 (collectives_bench: all-reduce and all-gather latencies, for project_tp.py
# --measured), then the offline benchmark at each size (OFFLINE_ARGS) with the engine's and the
# ranks' step timing; with DCP_TP_SIZES, an MLA model's offline run at those tp without and with
# decode context parallelism. Logs go to $OUT.
# Carry: .devcarry/cuda (house-llama), or a folder with house-mla named by STRATA_CARRY (the two
# house models do not fit in one call's carry): e.g. TP_FILTER='NcclComm.*:*/house_mla:*/llama_gqa'.
set -u
source bench/cuda/device_env.sh  # OUT, C, PKG, dev_configure, dev_build
nvidia-smi -L
t0=$(date +%s)
dev_configure
grep -i nccl "$OUT/cmake.log" | head -3
dev_build strata_parity_test strata_bench_offline_bench strata_bench_collectives_bench
echo "build: $(( $(date +%s) - t0 )) s"
export NCCL_NVLS_ENABLE=0
timeout 240 ./build-dev/strata_parity_test --gtest_filter="${TP_FILTER:-NcclComm.*:TpParity*:*DcpTpParity*}" >"$OUT/tp.log" 2>&1
echo "tp parity: exit status $?"
grep -vE "^\[ *(RUN|OK) |^\[20" "$OUT/tp.log" | tail -60
echo "tp: $(( $(date +%s) - t0 )) s"
for tp in ${TP_SIZES:-1 2}; do
  [ "$tp" -gt 1 ] || continue
  timeout 120 ./build-dev/strata_bench_collectives_bench --tp $tp >"$OUT/collectives_tp$tp.log" 2>&1
  echo "collectives tp $tp: exit status $?"
  grep -E "^collective" "$OUT/collectives_tp$tp.log"
done
# Decode context parallelism at the same memory fraction (issue 28): DCP_CONFIG (default the
# Moonlight shape; kimi-k2.5 on eight GPUs) at each tp of DCP_TP_SIZES without and with --dcp-size
# tp, the KV tokens each pool holds and the throughput.
for tp in ${DCP_TP_SIZES:-}; do
  for dcp in 1 $tp; do
    timeout ${OFFLINE_TIMEOUT:-200} ./build-dev/strata_bench_offline_bench \
      --config $C/shared/configs/${DCP_CONFIG:-moonlight-16b-a3b}/config.json \
      --tokenizer $C/shared/models/house-llama \
      --tp-size $tp --dcp-size $dcp ${DCP_OFFLINE_ARGS:---prompts 1000 --in 1024 --out 1024 --max-seconds 150} \
      >"$OUT/offline_dcp_tp${tp}_dcp$dcp.log" 2>&1
    echo "${DCP_CONFIG:-moonlight-16b-a3b} offline tp $tp dcp $dcp: exit status $?"
    grep -E "^(engine|offline|decode)" "$OUT/offline_dcp_tp${tp}_dcp$dcp.log" | cut -c1-220
  done
done
for tp in ${TP_SIZES:-1 2}; do
  STRATA_STEP_TIMING=1 timeout ${OFFLINE_TIMEOUT:-200} ./build-dev/strata_bench_offline_bench \
    --config $C/shared/configs/llama-3.1-8b/config.json --tokenizer $C/shared/models/house-llama \
    --tp-size $tp ${OFFLINE_ARGS:---prompts 256 --in 1024 --out 256} >"$OUT/offline_tp$tp.log" 2>&1
  echo "offline tp $tp: exit status $?"
  grep -vE "^progress" "$OUT/offline_tp$tp.log" | grep -vE "^\[20.*\] \[info\] (Loaded|Tokenizer)" | tail -24
  grep -E "^progress" "$OUT/offline_tp$tp.log" | tail -3
  echo "offline tp $tp done: $(( $(date +%s) - t0 )) s"
done
