#!/bin/bash
# Where a decode step's time goes (issues 24 and 21), on the GPU machine, from the repository
# root, `.devcarry/cuda` carried: per-kernel tables (kernel, launches per step, us per step, % of
# the step's kernel time) from `ncu --metrics gpu__time_duration.sum` over exactly one eager step
# (the benches' --ncu-step 1: cudaProfilerStart/Stop around it, ncu --profile-from-start off),
# aggregated by bench/cuda/ncu_table.py, next to the step's wall time under CUDA graphs without
# ncu (kernel sum vs wall = launch gaps; ncu serializes kernels, so PDL overlap is not in the sum).
# ncu runs with --clock-control none --cache-control none (the clocks and L2 as in production).
# Random weights in the stored format (bench_checkpoint.h), as rank_step_bench / llama_bench.
#
# Stages (STAGES, default "parity kimi moonlight w4a16"):
#   parity     the parity tests of the ops the 2026-12-02 fusions touch (rms_norm_columns, merged
#              rope, per-head GEMV, linear_silu_mul, MLA and MoE through the backend, the DeepSeek
#              fixtures' models, INT4 linears), PARITY_FILTER to change them.
#   kimi       one Kimi-K2.5 rank of tp 8 (INT4 experts, bf16 KV, context 4,096), batch 1 and
#              128: the config cut to 2 and 4 layers (1 dense + 1 / 3 MoE; the full rank loads in
#              minutes), every kernel's count and time projected linearly to 61 layers (the
#              layers are alike: the difference of the two cuts is exactly two MoE layers); the
#              wall is projected the same way (compare: 6.967 ms measured on all 61, 2026-12-01).
#              Also the backend's own per-op profile (events) of the 4-layer cut at batch 1.
#              KIMI_NCU_BATCHES (default "1 128"): the profiled batches; NCU_VARIANT: the
#              profiled steps under that named tunable change (tunable_variants.h).
#   moonlight  Moonlight-16B-A3B shape, bf16, batch 1 at context 768 (512 prompt + half of 512
#              generated: the engine run that gave 256 tok/s), tp 1: the wall on all 27 layers,
#              the kernels from 2- and 4-layer cuts projected to 27 (as kimi).
#   w4a16      Llama-3.1-8B W4A16 batch-1 decode after 512 tokens (llama_bench decode mode 4:
#              graphs + PDL, fused ops, GPU greedy = the engine's path), the INT4 register GEMV
#              with the product's settings and with the earlier ones (residency depth 1, one
#              block per SM, ring 16; CudaTunables::int4_gemv_*): walls on all 32 layers, the
#              kernels from 2- and 4-layer cuts projected to 32 (W4A16_NCU=0: walls only).
# (ncu takes ~0.1 s a kernel: the cuts keep each profile to a few hundred launches.)
# Tables on stdout (the top ${TOP:-15} kernels each); every log and CSV packed at the end into
# $OUT/decode_profile.tgz (the device returns only a few files).
set -u
source bench/cuda/device_env.sh  # OUT, C, PKG, dev_configure, dev_build
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
echo "ncu: ${NCU:-not found} $($NCU --version 2>/dev/null | tail -1)"
t0=$(date +%s)
dev_configure
STAGES=${STAGES:-parity kimi moonlight w4a16}
dev_build strata_bench_rank_step_bench strata_bench_llama_bench strata_bench_offline_bench
case " $STAGES " in *" parity "*) dev_build strata_parity_test ;; esac
echo "build: $(( $(date +%s) - t0 )) s"
t0=$(date +%s)
CFG=$C/shared/configs
W=/tmp/decode_profile
mkdir -p $W
RS=./build-dev/strata_bench_rank_step_bench
LB=./build-dev/strata_bench_llama_bench

cut_config() {  # SRC_CONFIG LAYERS OUT_DIR: the config with num_hidden_layers = LAYERS
  python3 - "$@" <<'PY'
import json, os, sys
src, layers, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
c = json.load(open(src))
(c.get("text_config") or c)["num_hidden_layers"] = layers
os.makedirs(out, exist_ok=True)
json.dump(c, open(f"{out}/config.json", "w"), indent=1)
PY
}
ncu_run() {  # NAME CMD...: one profiled step's kernels into $OUT/ncu_NAME.csv
  local name=$1
  shift
  timeout ${NCU_TIMEOUT:-150} $NCU --profile-from-start off --metrics gpu__time_duration.sum --csv \
    --clock-control none --cache-control none --log-file "$OUT/ncu_$name.csv" "$@" \
    >"$OUT/app_$name.log" 2>&1
  echo "ncu $name: rc $? ($(grep -c gpu__time_duration "$OUT/ncu_$name.csv" 2>/dev/null) kernels)"
}
graph_ms() {  # LOG BATCH: the step's ms as a CUDA graph from a rank_step_bench log
  grep -E "^decode   batch $2," "$1" | grep -oE "step [0-9.]+ ms as a CUDA graph" | grep -oE "[0-9.]+" | head -1
}

for stage in $STAGES; do
  t1=$(date +%s)
  case $stage in
    parity)
      F=${PARITY_FILTER:-'CudaParity.RmsNormColumns:CudaParity.RopeMergedAtTwoOffsets:CudaParity.PerHeadLinear:CudaParity.RmsNormAndResidual:CudaParity.RopeVariants:CudaFusedParity.LinearSiluMul:MlaBackend.*:MoeBackend.*:*MlaModel*:*MoeModel*:*QuantModel*:QuantLinear.*'}
      timeout 240 ./build-dev/strata_parity_test --gtest_filter="$F" >"$OUT/parity.log" 2>&1
      echo "parity: rc $?"
      grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|^\[  SKIPPED|Failure" "$OUT/parity.log" | head -30 ;;
    kimi)
      for L in 2 4; do
        cut_config "$CFG/kimi-k2.5/config.json" $L "$W/kimi$L"
        prof=0; [ $L = 4 ] && prof=1
        $RS --config "$W/kimi$L/config.json" --tp-size 8 --batches 1,128 --context 4096 --prefill 0 \
          --reps 10 --op-profile $prof --compare-unfused 1 >"$OUT/kimi${L}_wall.log" 2>&1
        echo "kimi $L layers wall: rc $?"
        grep -E "^model|^decode|^unfused" "$OUT/kimi${L}_wall.log"
        for B in ${KIMI_NCU_BATCHES:-1 128}; do
          ncu_run kimi${L}_b$B $RS --config "$W/kimi$L/config.json" --tp-size 8 --batches $B \
            --context 4096 --prefill 0 --reps 2 --ncu-step 1 ${NCU_VARIANT:+--ncu-variant $NCU_VARIANT}
        done
      done
      for B in ${KIMI_NCU_BATCHES:-1 128}; do
        python3 bench/cuda/ncu_table.py --top ${TOP:-15} --title "Kimi-K2.5 rank of tp 8, batch $B, context 4096" \
          --csv "$OUT/ncu_kimi2_b$B.csv" --csv "$OUT/ncu_kimi4_b$B.csv" --layers 2,4 --project 61 \
          --wall-ms "$(graph_ms "$OUT/kimi2_wall.log" $B),$(graph_ms "$OUT/kimi4_wall.log" $B)"
      done
      # The walls projected to 61 layers, with the 2026-12-02 fusions (CudaTunables::fusion) and
      # without: the before / after of one run (all 61 layers measured 6.967 ms on 2026-12-01).
      python3 - "$OUT/kimi2_wall.log" "$OUT/kimi4_wall.log" <<'PY'
import re, sys
def walls(path):
    text = open(path).read()
    fused = {int(b): float(ms) for b, ms in re.findall(r"^decode   batch (\d+),.*?step ([\d.]+) ms as a CUDA graph", text, re.M)}
    unfused = {int(b): float(ms) for b, ms in re.findall(r"^unfused  batch (\d+),.*?step ([\d.]+) ms", text, re.M)}
    return fused, unfused
(f2, u2), (f4, u4) = walls(sys.argv[1]), walls(sys.argv[2])
for b in sorted(f2):
    proj = lambda a, c: a[b] + (c[b] - a[b]) * (61 - 2) / 2
    line = f"kimi 61-layer step, batch {b}: fused {proj(f2, f4):.3f} ms"
    if b in u2 and b in u4:
        line += f", unfused {proj(u2, u4):.3f} ms"
    print(line + f" (2 layers {f2[b]:.3f}, 4 layers {f4[b]:.3f})")
PY
      sed -n '/^profile/,$p' "$OUT/kimi4_wall.log" | head -24 ;;
    moonlight)
      $RS --config "$CFG/moonlight-16b-a3b/config.json" --batches 1 --context 768 --prefill 0 \
        --reps 20 --compare-unfused 1 >"$OUT/moonlight_wall.log" 2>&1
      echo "moonlight wall: rc $?"
      grep -E "^model|^decode|^unfused" "$OUT/moonlight_wall.log"
      for L in 2 4; do
        cut_config "$CFG/moonlight-16b-a3b/config.json" $L "$W/moonlight$L"
        ncu_run moonlight$L $RS --config "$W/moonlight$L/config.json" --batches 1 --context 768 \
          --prefill 0 --reps 2 --ncu-step 1
      done
      # The engine's batch-1 decode (the 256 tok/s of 2026-12-01): the same model through the
      # scheduler, BatchPlan and sampling, against the bare step above.
      timeout 120 ./build-dev/strata_bench_offline_bench --config "$CFG/moonlight-16b-a3b/config.json" \
        --tokenizer "$C/shared/models/house-llama" --prompts 1 --in 512 --out 512 --breakdown-batch 0 \
        --max-seconds 60 >"$OUT/moonlight_engine.log" 2>&1
      echo "moonlight engine batch 1: rc $?"
      grep -E "^engine|^offline|^decode|CUDA graphs:" "$OUT/moonlight_engine.log" | head -5
      python3 bench/cuda/ncu_table.py --top ${TOP:-15} --title "Moonlight-16B-A3B bf16, batch 1, context 768" \
        --csv "$OUT/ncu_moonlight2.csv" --csv "$OUT/ncu_moonlight4.csv" --layers 2,4 --project 27 \
        --wall-ms "$(graph_ms "$OUT/moonlight_wall.log" 1)" ;;
    w4a16)
      for L in 2 4; do cut_config "$CFG/llama-3.1-8b-w4a16/config.json" $L "$W/w4a16_$L"; done
      # The INT4 register GEMV's settings: the product's defaults against the morning of
      # 2026-12-02's (residency depth 1, one block per SM, ring 16); W4A16_NCU=0 skips the tables.
      for variant in "default|" "d1_1block_ring16|--int4-gemv-depth 1 --int4-gemv-blocks-per-sm 0 --int4-gemv-ring 16"; do
        name=${variant%%|*}
        flags=${variant#*|}
        # shellcheck disable=SC2086
        DECODE_MODES=4 $LB --config "$CFG/llama-3.1-8b-w4a16/config.json" --what decode --steps 128 \
          $flags >"$OUT/w4a16_${name}_wall.log" 2>&1
        echo "w4a16 $name wall: rc $?"
        grep -E "^ceiling|^model|^decode" "$OUT/w4a16_${name}_wall.log"
        [ "${W4A16_NCU:-1}" = 1 ] || continue
        for L in 2 4; do
          # shellcheck disable=SC2086
          DECODE_MODES=4 ncu_run w4a16_${name}_$L $LB --config "$W/w4a16_$L/config.json" \
            --what decode --steps 4 $flags --ncu-step 1
        done
        wall=$(grep -E "^decode" "$OUT/w4a16_${name}_wall.log" | grep -oE "[0-9.]+ ms/token" | grep -oE "[0-9.]+" | head -1)
        python3 bench/cuda/ncu_table.py --top ${TOP:-15} --title "Llama-3.1-8B W4A16 batch 1 after 512, INT4 GEMV $name" \
          --csv "$OUT/ncu_w4a16_${name}_2.csv" --csv "$OUT/ncu_w4a16_${name}_4.csv" --layers 2,4 \
          --project 32 --wall-ms "$wall"
      done ;;
  esac
  echo "-- $stage: $(( $(date +%s) - t1 )) s"
done
echo "total after the build: $(( $(date +%s) - t0 )) s"
# (The archive is made outside $OUT: tar stops on a folder that changes as it reads it.)
(cd "$OUT" && tar czf /tmp/decode_profile.tgz . && find . -type f -delete && mv /tmp/decode_profile.tgz .)
ls -la "$OUT"
