#!/bin/bash
# Session 49, call 5: the decode split rule as committed (plan_decode_splits: one round of blocks
# for batches whose split fits the SMs, two where it overflows; 90% of four blocks an SM for
# larger batches) against the rule before 2026-12-07 (decode_old_splits), at the shapes calls 2-4
# measured; parity as session49d_check.sh. Carry .devcarry/llfx and the tree without
# tests/fixtures/hidden_states/*.safetensors; built on the GPU machine. The A/B lines by
# dev_rank_ab (device_env.sh; call 5 ran the same command inline).
set -u
STRATA_CARRY=${STRATA_CARRY:-$PWD/.devcarry/llfx} source bench/cuda/device_env.sh
dev_begin strata_parity_test strata_bench_kit
L=$OUT BIN=./build-dev
dev_parity ops "CudaParity.DecodeAttention*:CudaParity.DecodeSplitPlan:CudaParity.DecodeRopeFusion:KvFp8.DecodeAttention*" 120
dev_parity models "Fixtures/CudaModel.*:Fixtures/QuantModel.*:CudaModelGreedy.*:CudaModelLong.*:CudaEagle3.*:*house_llama*:PromptLogprobsParity.*" 400
echo "[parity @$(( $(date +%s) - t0 )) s]"
V=decode_old_splits,defaults
for i in 1 2; do
  dev_rank_ab llama-3.1-8b-w4a16 1 4096 $i
  dev_rank_ab llama-3.1-8b-w4a16 8 4096 $i
  for b in 16 17 32 48 64; do dev_rank_ab llama-3.1-8b-w4a16 $b 2048 $i; done
  echo "[round $i @$(( $(date +%s) - t0 )) s]"
done
echo "[session49e_check total @$(( $(date +%s) - t0 )) s]"
tar czf /tmp/logs.tgz -C "$OUT" . && mv /tmp/logs.tgz "$OUT/" && find "$OUT" -maxdepth 1 -name "*.log" -delete
