#!/bin/bash
# Session 48's device call (session 47's, never run: no device time in sessions 46 and 47). It
# builds on the GPU machine (~90 s: this session's CPU machine started fresh) unless the packs are
# carried: .devcarry/k57 (strata_parity_test and strata_bench_kit with decode_rope_fusion and
# decode_early_kv, both off by default) and .devcarry/k55 (the kit with the norm prologues' weights
# held in registers, bench/results/2026-12-07-session46-norm-weights-held.patch); always
# .devcarry/bench (debs, configs); the tree slimmed as make_carry.sh says when packs travel.
#   1. parity: CudaParity.DecodeRopeFusion (the merged launch's bits and launch count),
#      CudaParity.DecodeAttention* (DecodeAttentionEarlyKv: new in session 46),
#      CudaFusedParity.QkvRopeKvWrite;
#   2. rank_step_bench at batch 1, each kit in its own processes, alternating: Llama-3.1-8B
#      W4A16 (three rounds) and bf16 (two) with decode_rope_fusion and decode_early_kv beside
#      the defaults; k55's defaults beside no_int4_add_norm; Moonlight bf16 once a kit; one
#      timeline of the W4A16 step with and without decode_rope_fusion;
#   3. on an H200: mla_h200_ab.sh (the MLA decode defaults; Kimi rank and Moonlight at batch 1).
# SHORT=1: parity and one round of W4A16; SHORT=2: parity and the W4A16 rounds only.
set -u
source bench/cuda/prebuilt.sh
STRATA_CARRY=$PWD/.devcarry/bench source bench/cuda/device_env.sh  # dev_parity, dev_build
CFG=$PWD/.devcarry/bench/shared/configs
PATCH=bench/results/2026-12-07-session46-norm-weights-held.patch
if [ -d .devcarry/k57 ]; then
  prebuilt_begin k57 "$PWD/.devcarry/bench" || exit 1
  L=$OUT BIN=$PB
  for k in k57 k55; do  # each kit in its own folder (a patched one is named PATCH_strata_bench_kit)
    prebuilt_unpack $k >/dev/null || exit 1
    f=$(basename "$(ls .devcarry/$k/*strata_bench_kit.xz)" .xz)
    mkdir -p /tmp/kits/$k && cp "$PB/$f" /tmp/kits/$k/strata_bench_kit
  done
else  # built here: the tree's kit as k57, then with the patch applied as k55
  t0=$(date +%s) gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader)
  echo "gpu: $gpu"
  dev_configure
  dev_build strata_parity_test strata_bench_kit
  mkdir -p /tmp/kits/k57 /tmp/kits/k55 && cp build-dev/strata_bench_kit /tmp/kits/k57/
  git apply "$PATCH" && dev_build strata_bench_kit && cp build-dev/strata_bench_kit /tmp/kits/k55/
  git apply -R "$PATCH"
  echo "[built @$(( $(date +%s) - t0 )) s]"
  L=$OUT BIN=./build-dev
fi
dev_parity ops "CudaParity.DecodeRopeFusion:CudaParity.DecodeAttention*:CudaFusedParity.QkvRopeKvWrite" 180
grep "^decode rope fusion" "$OUT/parity_ops.log"
echo "[parity @$(( $(date +%s) - t0 )) s]"
step() {  # KIT CONFIG CONTEXT VARIANTS [MORE ARGS]
  local kit=$1 cfg=$2 ctx=$3 var=$4
  shift 4
  timeout 120 /tmp/kits/$kit/strata_bench_kit rank_step_bench --config "$CFG/$cfg/config.json" \
    --batches 1 --context "$ctx" --prefill 0 --reps 100 --variants "$var" "$@" \
    >"$OUT/${kit}_${cfg}_$i.log" 2>&1
  grep -E "^decode|^variant" "$OUT/${kit}_${cfg}_$i.log" | sed "s/^/$kit $cfg /" | cut -c1-110
}
W=llama-3.1-8b-w4a16
for i in 1 2 3; do
  [ "${SHORT:-0}" != 1 ] || [ $i -le 1 ] || break
  step k57 $W 512 decode_rope_fusion,defaults,decode_early_kv,defaults,decode_rope_fusion,defaults
  step k55 $W 512 defaults,no_int4_add_norm,defaults,no_int4_add_norm
  [ $i -le 2 ] && [ "${SHORT:-0}" = 0 ] || continue
  step k57 llama-3.1-8b 512 decode_rope_fusion,defaults,decode_early_kv,defaults,decode_rope_fusion,defaults
  step k55 llama-3.1-8b 512 defaults,defaults
  echo "[round $i @$(( $(date +%s) - t0 )) s]"
done
if [ "${SHORT:-0}" = 0 ]; then
  i=m
  step k57 moonlight-16b-a3b 768 defaults
  step k55 moonlight-16b-a3b 768 defaults
  i=t
  step k57 $W 512 defaults --timeline 1 --timeline-variants decode_rope_fusion
  grep -E "qkv_rope|decode_kernel|combine_kernel|wall" "$OUT/k57_${W}_t.log" | cut -c1-150
  echo "[timeline @$(( $(date +%s) - t0 )) s]"
fi
if [[ $gpu == *H200* && ${SHORT:-0} == 0 && -d .devcarry/k57 ]]; then  # mla_h200_ab reads the packs
  OUT=$OUT/mla PREBUILT=k57 CARRY=$PWD/.devcarry/bench bash bench/cuda/mla_h200_ab.sh 2>&1 | grep -v "NMSE" |
    grep -E "^ceiling|^acc|^pf0|^mla|^kimi 61|^decode|^variant|^\[" | cut -c1-200
fi
echo "[session48_check total @$(( $(date +%s) - t0 )) s]"
