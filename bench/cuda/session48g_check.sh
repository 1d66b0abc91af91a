#!/bin/bash
# Session 48's last H100 call: greedy sampling of small batches by clusters of 8 blocks a row
# (sample_split_max_rows 64; variant no_sample_split) and the decode split merge (combine_kernel)
# loading its first 8 partial outputs with the (max, sum) pairs. Both measured and dropped: they
# ran as bench/results/2026-12-07-session48-{greedy-split,combine-held}.patch applied to 4234359;
# to rerun, apply both and keep the reverse of the second as the "unheld" patch below. Built on
# the GPU machine, the kit twice: as the tree is (new) and with the merge as before (old). Carry
# .devcarry/llfx and the tree without tests/fixtures/hidden_states/*.safetensors (restore: git
# checkout -- tests/fixtures).
set -u
STRATA_CARRY=$PWD/.devcarry/llfx source bench/cuda/device_env.sh
dev_begin strata_parity_test strata_bench_kit
mkdir -p /tmp/kits/new /tmp/kits/old && cp build-dev/strata_bench_kit /tmp/kits/new/
P=bench/results/2026-12-07-session48-combine-unheld.patch
git apply "$P" && dev_build strata_bench_kit && cp build-dev/strata_bench_kit /tmp/kits/old/
git apply -R "$P"
echo "[built @$(( $(date +%s) - t0 )) s]"
L=$OUT BIN=./build-dev
dev_parity ops "CudaSampling.*:CudaParity.DecodeAttention*:CudaParity.DecodeRopeFusion:KvFp8.DecodeAttention*:CudaModelGreedy.*:CudaModelLong.*:Fixtures/CudaModel.*" 300
grep -E "^sampling greedy|greedy tokens equal|argmax agreement [0-9]+ /" "$OUT/parity_ops.log" | cut -c1-120 | head -24
echo "[parity @$(( $(date +%s) - t0 )) s]"
CFG=$C/shared/configs
step() {  # KIT CONFIG TAG [MORE ARGS]
  local kit=$1 cfg=$2 tag=$3
  shift 3
  timeout 150 /tmp/kits/$kit/strata_bench_kit rank_step_bench --config "$CFG/$cfg/config.json" --batches 1 \
    --context 512 --prefill 0 --reps 100 --variants no_sample_split,defaults,no_sample_split,defaults "$@" \
    >"$OUT/${kit}_${cfg}_$tag.log" 2>&1
  grep -E "^decode|^variant" "$OUT/${kit}_${cfg}_$tag.log" | sed "s/^/$kit $cfg /" | cut -c1-115
}
for i in 1 2; do
  for cfg in llama-3.1-8b-w4a16 llama-3.1-8b; do step new $cfg $i; step old $cfg $i; done
  echo "[round $i @$(( $(date +%s) - t0 )) s]"
done
for kit in new old; do
  step $kit llama-3.1-8b-w4a16 t --timeline 1 --timeline-variants no_sample_split
  grep -E "^timeline|combine_kernel|sample_kernel|greedy_split" "$OUT/${kit}_llama-3.1-8b-w4a16_t.log" | cut -c1-140
done
echo "[session48g_check total @$(( $(date +%s) - t0 )) s]"
tar czf /tmp/logs.tgz -C "$OUT" . && mv /tmp/logs.tgz "$OUT/" && find "$OUT" -maxdepth 1 -name "*.log" -delete
