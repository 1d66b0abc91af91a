#!/bin/bash
# Prepared in session 49; ran as session 50's call 1 (H100: bench/results/2026-12-07-session50.md). Carry .devcarry/llfx and the tree
# without tests/fixtures/hidden_states/*.safetensors (restore: git checkout -- tests/fixtures);
# built on the GPU machine. Ask for nvidia-h200: every call of sessions 48-49 got an H100.
#   1. parity: the decode kernels and DecodeSplitPlan;
#   2. decode's split rule (session 49) against the rule before (decode_old_splits), bf16 KV at
#      batch 1 / 16 / 64 (4,096 / 2,048 / 2,048 keys) and fp8_e4m3 KV at batch 1 / 16 (not yet
#      measured: the rule was fitted on bf16 KV), two rounds;
#   3. on an H200: session48f_check.sh's rows (Llama W4A16 batch 1, the Kimi rank and Moonlight,
#      MLA acceptance), within the call's time.
set -u
STRATA_CARRY=${STRATA_CARRY:-$PWD/.devcarry/llfx} source bench/cuda/device_env.sh
dev_begin strata_parity_test strata_bench_kit
L=$OUT BIN=./build-dev
dev_parity ops "CudaParity.DecodeAttention*:CudaParity.DecodeSplitPlan:CudaParity.DecodeRopeFusion:KvFp8.DecodeAttention*" 120
V=decode_old_splits,defaults
for i in 1 2; do
  dev_rank_ab llama-3.1-8b-w4a16 1 4096 $i
  dev_rank_ab llama-3.1-8b-w4a16 16 2048 $i
  dev_rank_ab llama-3.1-8b-w4a16 64 2048 $i
  # fp8 KV: 4 resident decode blocks an SM (56 KB of shared memory) where bf16 has 2; two an SM
  # beside the rule's one.
  V=decode_old_splits,decode_bps2,defaults dev_rank_ab llama-3.1-8b-w4a16 1 4096 fp8_$i --kv-cache-dtype fp8_e4m3
  V=decode_old_splits,decode_bps2,defaults dev_rank_ab llama-3.1-8b-w4a16 16 2048 fp8_$i --kv-cache-dtype fp8_e4m3
  echo "[round $i @$(( $(date +%s) - t0 )) s]"
done
if [[ $gpu == *H200* ]]; then
  STRATA_CARRY=$C OUT=$OUT/rows timeout $(( 570 - $(date +%s) + t0 )) bash bench/cuda/session48f_check.sh
fi
echo "[session50_check total @$(( $(date +%s) - t0 )) s]"
tar czf /tmp/logs.tgz -C "$OUT" . && mv /tmp/logs.tgz "$OUT/" && find "$OUT" -maxdepth 1 -name "*.log" -delete
