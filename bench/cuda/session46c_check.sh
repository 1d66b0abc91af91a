#!/bin/bash
# Session 46's calls in one (the device starts failed most of the session; carry .devcarry/k56 —
# strata_parity_test and strata_bench_kit at 69bb0ed: decode_early_kv, off by default —
# .devcarry/k55 — strata_bench_kit at main with the norm prologues' weights loaded into registers
# before the PDL wait, bench/results/2026-12-07-session46-norm-weights-held.patch — and
# .devcarry/bench; the tree slimmed as make_carry.sh says):
#   1. parity: CudaParity.DecodeAttention* (DecodeAttentionEarlyKv: new), the prefill attention;
#   2. the kits in alternating processes, rank_step_bench at batch 1: Llama-3.1-8B W4A16 (three
#      rounds) and bf16, Moonlight bf16 (two), with k56's decode_early_kv beside its defaults;
#   3. on an H200: mla_h200_ab.sh (the MLA decode defaults; Kimi rank and Moonlight at batch 1).
set -u
source bench/cuda/prebuilt.sh
prebuilt_begin k56 "$PWD/.devcarry/bench" || exit 1
L=$OUT BIN=$PB
STRATA_CARRY=$PWD/.devcarry/bench source bench/cuda/device_env.sh  # dev_parity
f="CudaParity.DecodeAttention*"
[ "${SHORT:-0}" = 3 ] || f="$f:CudaParity.PrefillAttention*"
dev_parity ops "$f" 120
echo "[parity @$(( $(date +%s) - t0 )) s]"
if [ "${SHORT:-0}" = 3 ]; then  # the least device time: one W4A16 process of k56
  timeout 60 "$PB/strata_bench_rank_step_bench" \
    --config "$PWD/.devcarry/bench/shared/configs/llama-3.1-8b-w4a16/config.json" --batches 1 \
    --context 512 --prefill 0 --reps 100 --variants decode_early_kv,defaults,decode_early_kv,defaults \
    2>&1 | grep -E "^decode|^variant" | cut -c1-100
  exit 0
fi
CFG=$PWD/.devcarry/bench/shared/configs
for k in k56 k55; do  # each kit in its own folder (a patched one is named PATCH_strata_bench_kit)
  prebuilt_unpack $k >/dev/null || exit 1
  f=$(basename "$(ls .devcarry/$k/*strata_bench_kit.xz)" .xz)
  mkdir -p /tmp/kits/$k && cp "$PB/$f" /tmp/kits/$k/strata_bench_kit
done
step() {  # KIT CONFIG CONTEXT VARIANTS
  timeout 100 /tmp/kits/$1/strata_bench_kit rank_step_bench --config "$CFG/$2/config.json" \
    --batches 1 --context "$3" --prefill 0 --reps 100 --variants "$4" >"$OUT/$1_$2_$i.log" 2>&1
  grep -E "^decode|^variant" "$OUT/$1_$2_$i.log" | sed "s/^/$1 $2 /" | cut -c1-100
}
# SHORT=1 (little device time left): two rounds of W4A16 only; SHORT=2: one; SHORT=3: above.
for i in 1 2 3; do
  [ "${SHORT:-0}" = 0 ] || [ $i -le $((3 - SHORT)) ] || break
  step k56 llama-3.1-8b-w4a16 512 decode_early_kv,defaults,decode_early_kv,defaults,no_int4_add_norm
  step k55 llama-3.1-8b-w4a16 512 defaults,no_int4_add_norm,defaults,no_int4_add_norm
  [ $i -le 2 ] && [ "${SHORT:-0}" = 0 ] || continue
  step k56 llama-3.1-8b 512 decode_early_kv,defaults,decode_early_kv,defaults
  step k55 llama-3.1-8b 512 defaults,defaults
  step k56 moonlight-16b-a3b 768 defaults
  step k55 moonlight-16b-a3b 768 defaults
  echo "[round $i @$(( $(date +%s) - t0 )) s]"
done
if [[ $gpu == *H200* && ${SHORT:-0} == 0 ]]; then
  OUT=$OUT/mla PREBUILT=k56 CARRY=$PWD/.devcarry/bench bash bench/cuda/mla_h200_ab.sh 2>&1 | grep -v "NMSE" |
    grep -E "^ceiling|^acc|^pf0|^mla|^kimi 61|^decode|^variant|^\[" | cut -c1-200
fi
echo "[session46c_check total @$(( $(date +%s) - t0 )) s]"
