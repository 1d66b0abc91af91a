#!/bin/bash
# Session 10's checks, one build, on the GPU machine from the repository root (carry
# STRATA_CARRY=$PWD/.devcarry/cuda: debs, shared/{configs,fixtures}, models/house-llama). Stages
# (STAGES, in this order; default all):
#   parity     PARITY_FILTER (default: the MoE, INT4 and MLA suites and the DeepSeek fixtures'
#              greedy; house-mla rows left out: the carry lacks house-mla)
#   moe        one Kimi-K2.5 rank's MoE layer through the backend (moe_bench --what backend) at
#              MOE_TOKENS, the defaults and MOE_VARIANTS (A/B in one process)
#   kimi       one Kimi-K2.5 rank of tp 8, cuts of KIMI_CUTS layers (default "4 8 12"; three or
#              more, e.g. "4 8 12": a least-squares line and its largest residual) at
#              KIMI_BATCHES projected to 61 layers, the defaults and KIMI_VARIANTS
#              (rank_step_bench, A/B in one process)
#   dsv3       one DeepSeek-V3 rank of tp 8 (FP8 experts), cuts of DSV3_CUTS layers projected to 61
#              at DSV3_BATCHES, the defaults and DSV3_VARIANTS (default fp8_bf16x), as kimi
#   moonlight  Moonlight bf16 batch 1 (27 layers, context 768), MOONLIGHT_VARIANTS (timeout
#              MOONLIGHT_TIMEOUT s, default 150)
#   offline    the Moonlight shape offline, 1,000 x 1,024 / 1,024, bf16 (offline_bench): the
#              defaults, then each of OFFLINE_VARIANTS (one engine each)
#   llama      the Llama-3.1-8B shape (LLAMA_CONFIG, default llama-3.1-8b; llama-3.1-8b-w4a16:
#              INT4), batch 1, context 512, LLAMA_VARIANTS
#   mla        the MLA decode kernel's own split merge against the merge kernel, then issue 22's
#              acceptance rows (mla_bench --what ceilings,merge,acceptance; MLA_WHAT for others,
#              e.g. ceilings,batch1)
#   sweep      the MoE decode GEMV's work shapes (moe_bench --what kernels --sweep 1) for
#              SWEEP_CONFIGS (default moonlight) at SWEEP_TOKENS (default 1,2,4,8)
# (llama, dsv3, mla and sweep run only when named in STAGES.)
# EXTRA_TARGETS: more targets to build (e.g. strata_bench_moe_bench for a command after this one).
# RANK_EXTRA: more arguments for every rank_step_bench run (e.g. "--timeline 1": the step's
# kernels as the GPU ran them, kernel_timeline.h; its tables are echoed on stdout).
# PREBUILT=NAME: run the benchmarks that bench/cuda/prebuilt.sh packed into .devcarry/NAME on
# the CPU machine (carry it) instead of building here: no device time spent building (the
# stages' targets above must be in it; STRATA_CARRY then needs only shared/configs).
# Logs packed into $OUT/session10_check.tgz; the summary on stdout.
set -u
source bench/cuda/device_env.sh
t0=$(date +%s)
STAGES=${STAGES:-parity moe kimi moonlight offline}
# Only the targets the stages run (each is minutes of the device's build).
targets=()
for stage in $STAGES; do
  case $stage in
    parity) targets+=(strata_parity_test) ;;
    moe | sweep) targets+=(strata_bench_moe_bench) ;;
    kimi | dsv3 | moonlight | llama) targets+=(strata_bench_rank_step_bench) ;;
    mla) targets+=(strata_bench_mla_bench) ;;
    offline) targets+=(strata_bench_offline_bench) ;;
  esac
done
if [ -n "${PREBUILT:-}" ]; then
  source bench/cuda/prebuilt.sh unpack "$PREBUILT" || exit 1
  BIN=$PB
  for t in "${targets[@]}"; do [ -x "$BIN/$t" ] || { echo "$PREBUILT lacks $t"; exit 1; }; done
else
  dev_configure
  dev_build $(printf '%s\n' "${targets[@]}" | sort -u) ${EXTRA_TARGETS:-}
  BIN=./build-dev
fi
echo "build: $(( $(date +%s) - t0 )) s"
L=$OUT/session10_check
mkdir -p $L
pack() { tar czf "$OUT/session10_check.tgz" -C "$OUT" session10_check; }
trap pack EXIT
CFG=$C/shared/configs
W=/tmp/session10_check
timeline_tables() {  # LOG: each timeline's summary and by-kernel table (not the per-kernel list)
  awk '/^timeline/ {on = 1; print; next} /^  +# / || !/^  / {on = 0} on' "$1" | cut -c1-130
}
# One tp-8 rank of a model (NAME, configs/CONFIG) cut to each of CUTS layers, timed at BATCHES with
# VARIANTS (rank_step_bench, A/B in one process), then projected to 61 layers (rank_cuts.py).
rank_stage() {  # NAME CONFIG CUTS BATCHES VARIANTS
  local name=$1 config=$2 cuts=($3) batches=$4 variants=$5 logs=() n
  for n in "${cuts[@]}"; do
    python3 bench/cuda/rank_cuts.py cut "$CFG/$config/config.json" $n "$W/${name}_$n"
    timeout 150 $BIN/strata_bench_rank_step_bench --config "$W/${name}_$n/config.json" \
      --tp-size 8 --batches "$batches" --context 4096 --prefill 0 --reps 100 \
      --variants "$variants" ${RANK_EXTRA:-} >"$L/${name}_$n.log" 2>&1
    echo "$name $n layers: exit $?"
    timeline_tables "$L/${name}_$n.log"
    logs+=("$L/${name}_$n.log")
  done
  python3 bench/cuda/rank_cuts.py project "${logs[@]}" --layers "$(IFS=,; echo "${cuts[*]}")" \
    --name "$name"
}
for stage in $STAGES; do
  t1=$(date +%s)
  case $stage in
    parity)
      dev_parity suites "${PARITY_FILTER:-MoeParity.*:MoeBackend.*:Int4Parity.*:*MoeModel*:MoeCombineNorm.*:SideBranch.*:MlaAttention.*:MlaBackend.*:Fixtures/MlaModel.*/deepseek*:*QuantModel*-*HouseMla*:*house_mla*:MlaModelLong.*}" 240 ;;
    moe)
      timeout 200 $BIN/strata_bench_moe_bench --what backend --backend-configs kimi \
        --tokens "${MOE_TOKENS:-1,8,32,128}" --variants "${MOE_VARIANTS:-moe_down224}" \
        >"$L/moe.log" 2>&1
      echo "moe: exit $?"
      grep -E "^moe .*experts" "$L/moe.log" | cut -c1-200 | head -40 ;;
    kimi)
      rank_stage kimi kimi-k2.5 "${KIMI_CUTS:-4 8 12}" "${KIMI_BATCHES:-1,32,128}" \
        "${KIMI_VARIANTS:-segments64}" ;;
    dsv3)
      rank_stage dsv3 deepseek-v3 "${DSV3_CUTS:-4 8 12}" "${DSV3_BATCHES:-1,32,128}" \
        "${DSV3_VARIANTS:-fp8_bf16x}" ;;
    mla)
      timeout 150 $BIN/strata_bench_mla_bench --what "${MLA_WHAT:-ceilings,merge,acceptance}" \
        >"$L/mla.log" 2>&1
      echo "mla: exit $?"
      grep -E "^ceiling|^mla|^prof" "$L/mla.log" | sed 's/ of latent rows//' | cut -c1-220 ;;
    moonlight)
      timeout ${MOONLIGHT_TIMEOUT:-150} $BIN/strata_bench_rank_step_bench \
        --config "$CFG/moonlight-16b-a3b/config.json" --batches 1 --context 768 --prefill 0 \
        --reps 100 --variants "${MOONLIGHT_VARIANTS:-segments64}" ${RANK_EXTRA:-} \
        >"$L/moonlight.log" 2>&1
      echo "moonlight: exit $?"
      grep -E "^decode|^variant" "$L/moonlight.log" | cut -c1-200
      timeline_tables "$L/moonlight.log" ;;
    offline)
      for v in default ${OFFLINE_VARIANTS:-}; do
        arg=""
        [ "$v" = default ] || arg="--variant $v"
        timeout 200 $BIN/strata_bench_offline_bench \
          --config "$CFG/moonlight-16b-a3b/config.json" --tokenizer "$C/shared/models/house-llama" \
          --breakdown-batch 0 $arg >"$L/offline_$v.log" 2>&1
        echo "moonlight offline ($v): exit $?"
        grep -E "^variant|^offline|^decode" "$L/offline_$v.log" | cut -c1-220
      done ;;
    llama)
      timeout 100 $BIN/strata_bench_rank_step_bench \
        --config "$CFG/${LLAMA_CONFIG:-llama-3.1-8b}/config.json" --batches 1 --context 512 \
        --prefill 0 --reps 100 --variants "${LLAMA_VARIANTS:-segments64}" ${RANK_EXTRA:-} \
        >"$L/llama.log" 2>&1
      echo "llama: exit $?"
      grep -E "^decode|^variant" "$L/llama.log" | cut -c1-200
      timeline_tables "$L/llama.log" ;;
    sweep)
      timeout 200 $BIN/strata_bench_moe_bench --what kernels \
        --configs "${SWEEP_CONFIGS:-moonlight}" --tokens "${SWEEP_TOKENS:-1,2,4,8}" --sweep 1 \
        >"$L/sweep.log" 2>&1
      echo "sweep: exit $?"
      grep -E "^sweep|^ceiling|copy" "$L/sweep.log" | cut -c1-300 | head -60 ;;
  esac
  echo "-- $stage: $(( $(date +%s) - t1 )) s"
done
echo "total: $(( $(date +%s) - t0 )) s"
