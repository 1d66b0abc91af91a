#!/bin/bash
# Session 46's A/B of the norm prologues' weights before the PDL wait (carry .devcarry/k52k —
# strata_bench_kit at main — .devcarry/k54 and .devcarry/k55 — the same built with, in the W4A16
# register GEMV's prologue and the bf16 GEMV's, the norm's weights prefetched into L2
# (bench/results/2026-12-07-session46-norm-prologue-prefetch-both.patch) or loaded into registers
# (bench/results/2026-12-07-session46-norm-weights-held.patch) — and .devcarry/bench; the tree
# slimmed as make_carry.sh says): the kits in alternating processes, rank_step_bench at batch 1
# (W4A16: the defaults and no_int4_add_norm, no prologue, the change's own control). No bits
# change. Llama-3.1-8B W4A16, three rounds; Llama-3.1-8B bf16 and Moonlight bf16 (context 768), two.
set -u
KITS=${KITS:-k52k k54 k55}
source bench/cuda/prebuilt.sh
prebuilt_begin k52k "$PWD/.devcarry/bench" >/dev/null || exit 1
echo "gpu: $gpu"
CFG=$PWD/.devcarry/bench/shared/configs
for k in $KITS; do  # each kit in its own folder (a patched one is named PATCH_strata_bench_kit)
  prebuilt_unpack $k >/dev/null || exit 1
  f=$(basename "$(ls .devcarry/$k/*strata_bench_kit.xz)" .xz)
  mkdir -p /tmp/kits/$k && cp "$PB/$f" /tmp/kits/$k/strata_bench_kit
done
md5sum /tmp/kits/*/strata_bench_kit
step() {  # KIT CONFIG CONTEXT VARIANTS
  timeout 100 /tmp/kits/$1/strata_bench_kit rank_step_bench --config "$CFG/$2/config.json" \
    --batches 1 --context "$3" --prefill 0 --reps 100 --variants "$4" >"$OUT/$1_$2_$i.log" 2>&1
  grep -E "^decode|^variant" "$OUT/$1_$2_$i.log" | sed "s/^/$1 $2 /" | cut -c1-100
}
for i in 1 2 3; do
  for k in $KITS; do
    step $k llama-3.1-8b-w4a16 512 defaults,no_int4_add_norm,defaults,no_int4_add_norm
  done
  [ $i -le 2 ] || continue
  for k in $KITS; do step $k llama-3.1-8b 512 defaults,defaults; done
  for k in $KITS; do step $k moonlight-16b-a3b 768 defaults,defaults; done
  echo "[round $i @$(( $(date +%s) - t0 )) s]"
done
echo "[session46b_check total @$(( $(date +%s) - t0 )) s]"
