#!/bin/bash
# MLA wired into the CUDA backend (issue 22) on the GPU machine, from the repository root. Stages
# (STAGES, default "parity mla llama"; the build always runs first):
#   parity  strata_parity_test on the MLA suites: MlaBackend.* (kv_write + mla_attention vs the
#           CPU backend, every KV layout, graphs, the CPU twin of unbuilt dims), MlaModel* (tiny
#           DeepSeek fixtures and house-mla vs HF, vs the reference MLA, greedy vs the CPU
#           backend), MlaEngine.* (every MLA KV dtype through the engine, zero MLA fallbacks), the
#           layout checks (KvFp8.RefusesLayoutsItDoesNotImplement) and the kernels' byte-exact
#           write (MlaAttention.KvWriteStoresTheCpuBytes); PARITY_FILTER overrides the filter;
#   mla     `strata generate` on house-mla, PROMPTS (default 64) chat prompts of
#           data/prompts-explain.jsonl x NEW_TOKENS (default 128) greedy tokens (--ignore-eos):
#           --device cuda (graphs on, the default), cuda with graphs off, cuda with an
#           fp8_flashmla cache, and --device cpu; each run's generation tok/s and CPU-fallback
#           line, and how many outputs equal the bf16 cuda run's;
#   llama   the same prompts through house-llama on cuda (the sanity reference), when the carry
#           holds house-llama.
# Carry: both house models do not fit in one call's 64 MiB, so: .devcarry/mla (house-mla, the
# tiny fixtures, data) with STRATA_CARRY=$PWD/.devcarry/mla for "parity mla"; the llama stage
# then in a second call with .devcarry/cuda carried (STAGES=llama; the warm machine keeps
# build-dev). Logs: $OUT/logs.tgz, a summary on stdout.
set -u
FINAL_OUT=${OUT:-/tmp/strata_out}
mkdir -p "$FINAL_OUT"
W=/tmp/mla_wire_check
rm -rf "$W" && mkdir -p "$W"
export OUT=$W
source bench/cuda/device_env.sh  # C, PKG, dev_configure, dev_build
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t0=$(date +%s)
dev_configure
case " ${STAGES:-parity mla llama} " in
  *" parity "*) dev_build strata_parity_test strata ;;
  *) dev_build strata ;;
esac
echo "build: $(( $(date +%s) - t0 )) s"
head -"${PROMPTS:-64}" "$C/shared/data/prompts-explain.jsonl" >"$W/prompts.jsonl"
N=${NEW_TOKENS:-128}

# generate NAME MODEL_DIR ARGS...: one `strata generate` run, its summary lines.
generate() {
  local name=$1 model=$2
  shift 2
  local t1=$(date +%s%N)
  timeout 120 ./build-dev/strata generate --model-path "$model" --input "$W/prompts.jsonl" \
    -o "$W/out_$name.jsonl" --max-new-tokens "$N" --temperature 0 --ignore-eos --progress-interval 1000 "$@" \
    >"$W/gen_$name.log" 2>&1
  local rc=$?
  echo "$name: exit $rc, $(( ($(date +%s%N) - t1) / 1000000 )) ms wall (load included)"
  grep -E "generation .* tok/s|CPU fallback|CUDA graphs:|error|CHECK" "$W/gen_$name.log" | head -6 | sed 's/^/  /'
}
# same A B: outputs of run B equal to run A's (greedy, same prompts).
same() {
  python3 - "$W/out_$1.jsonl" "$W/out_$2.jsonl" "$1" "$2" <<'PY'
import json, sys
def load(p):
    try:
        return {r["id"]: r.get("conversations") for r in map(json.loads, open(p))}
    except OSError:
        return {}
a, b = load(sys.argv[1]), load(sys.argv[2])
print(f"  outputs of {sys.argv[4]} equal to {sys.argv[3]}'s: {sum(a[k] == b.get(k) for k in a)}/{len(a)}")
PY
}

for stage in ${STAGES:-parity mla llama}; do
  t1=$(date +%s)
  case $stage in
    parity)
      timeout 150 ./build-dev/strata_parity_test --gtest_filter="${PARITY_FILTER:-MlaBackend.*:*MlaModel*:MlaEngine.*:KvFp8.RefusesLayoutsItDoesNotImplement:MlaAttention.KvWriteStoresTheCpuBytes}" \
        >"$W/parity.log" 2>&1
      echo "parity: exit $?"
      grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure|CHECK|Expected|Which is|nmse vs HF|greedy tokens|argmax agreement|mla_attention CPU|graphs on and off|graphs:" \
        "$W/parity.log" | head -80 ;;
    mla)
      M=$C/shared/models/house-mla
      [ -d "$M" ] || { echo "mla: no $M in the carry (STRATA_CARRY=\$PWD/.devcarry/mla)"; continue; }
      generate mla_cuda "$M" --device cuda --mem-fraction-static 0.5
      generate mla_cuda_eager "$M" --device cuda --mem-fraction-static 0.5 --cuda-graph-max-bs 0
      generate mla_cuda_flashmla "$M" --device cuda --mem-fraction-static 0.5 --kv-cache-dtype fp8_flashmla --allow-lossy-kv
      generate mla_cpu "$M" --device cpu
      same mla_cuda mla_cuda_eager
      same mla_cuda mla_cuda_flashmla
      same mla_cuda mla_cpu ;;
    llama)
      M=$C/shared/models/house-llama
      [ -d "$M" ] || { echo "llama: no $M in the carry: run again with .devcarry/cuda carried, STAGES=llama"; continue; }
      generate llama_cuda "$M" --device cuda --mem-fraction-static 0.5 ;;
  esac
  echo "-- $stage: $(( $(date +%s) - t1 )) s"
done
tar czf "$FINAL_OUT/logs.tgz" -C "$W" .
echo "total: $(( $(date +%s) - t0 )) s"
