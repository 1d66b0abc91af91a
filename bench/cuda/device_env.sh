# Sourced by the bench/cuda/*.sh device scripts (from the repository root on the GPU machine):
# unpacks the carried pcre2/pkgconf .debs (the image has neither) and points pkg-config and the
# loader at them. Sets OUT (log folder), C (the carried folder: debs/ and shared/; .devcarry/cuda
# unless STRATA_CARRY names another: .devcarry/mla holds house-mla, .devcarry/all both house
# models packed, see below), P (unpacked deps) and PKG (extra cmake flag naming pkgconf when the
# image has no pkg-config). Defines dev_configure [cmake flags], dev_build TARGET..., dev_begin
# TARGET..., dev_parity, dev_rank_ab and dev_house_prompts FILE.
OUT=${OUT:-/tmp/strata_out}
mkdir -p "$OUT"
C=${STRATA_CARRY:-$PWD/.devcarry/cuda}
P=/tmp/strata_deps
mkdir -p $P
for f in $C/debs/*.deb; do dpkg -x "$f" $P; done
for pc in $P/usr/lib/x86_64-linux-gnu/pkgconfig/*.pc; do sed -i "s|^prefix=.*|prefix=$P/usr|" "$pc"; done
export PKG_CONFIG_PATH=$P/usr/lib/x86_64-linux-gnu/pkgconfig
export LD_LIBRARY_PATH=$P/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
PKG=""
command -v pkg-config >/dev/null || PKG="-DPKG_CONFIG_EXECUTABLE=$P/usr/bin/pkgconf"
# A carry with both house models packed (.devcarry/all: `tar c house-llama house-mla | xz -9` as
# shared/models.tar.xz, 47 MB where the two are 69 MB) is unpacked once; the image has no zstd.
if [ -f "$C/shared/models.tar.xz" ] && [ ! -d "$C/shared/models/house-mla" ]; then
  mkdir -p "$C/shared/models"
  python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" \
    "$C/shared/models.tar.xz" "$C/shared/models"
fi

# The Release CUDA build in build-dev, reading the carried models and fixtures.
dev_configure() {
  cmake -S . -B build-dev -G Ninja -DSTRATA_CUDA=ON -DCMAKE_BUILD_TYPE=Release \
    -DSTRATA_SHARED_DIR=$C/shared $PKG "$@" >"$OUT/cmake.log" 2>&1 || { tail -40 "$OUT/cmake.log"; exit 1; }
}
dev_build() {
  cmake --build build-dev -j"$(nproc)" --target "$@" >>"$OUT/build.log" 2>&1 ||
    { grep -B3 -A12 -E "error|Error" "$OUT/build.log" | head -80; exit 1; }
}

# A session script's start (after sourcing this file): t0, the GPU's name in $gpu and on stdout,
# the Release build of TARGETS in build-dev.
dev_begin() {  # TARGET...
  t0=$(date +%s)
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader)
  echo "gpu: $gpu"
  dev_configure
  dev_build "$@"
  echo "[built @$(( $(date +%s) - t0 )) s]"
}

# One parity run (BIN: the binaries' folder, default build-dev; bench/cuda/prebuilt.sh's $PB for
# binaries carried prebuilt): the parity tests matching FILTER (at most TIMEOUT s), logged to
# $L/parity_NAME.log ($L: the calling script's log folder); a summary line, then the lines of the
# failures and skips.
dev_parity() {  # NAME FILTER TIMEOUT
  local t1=$(date +%s) log="$L/parity_$1.log"
  timeout "$3" "${BIN:-./build-dev}/strata_parity_test" --gtest_filter="$2" >"$log" 2>&1
  echo "parity $1: exit $?, $(( $(date +%s) - t1 )) s; $(grep -c '^\[       OK \]' "$log") ok;" \
    "$(grep -E '^\[  (PASSED|FAILED)  \]' "$log" | tr '\n' ' ')"
  grep -E "^\[  FAILED  \]|^\[  SKIPPED \]|Failure$" -A3 "$log" | head -16
}

# One rank_step_bench A/B (BIN's strata_bench_kit, default dev_begin's build): decode steps of
# CONFIG (a folder of $C/shared/configs) at BATCH sequences of CONTEXT keys, the variants in $V
# alternating in one process, logged to $OUT/CONFIG_bBATCH_cCONTEXT_TAG.log; prints the variant
# lines, shortened.
# Further arguments go to rank_step_bench (e.g. --kv-cache-dtype fp8_e4m3).
dev_rank_ab() {  # CONFIG BATCH CONTEXT TAG [ARG...]
  local log="$OUT/$1_b$2_c$3_$4.log"
  timeout 200 "${BIN:-./build-dev}/strata_bench_kit" rank_step_bench --config "$C/shared/configs/$1/config.json" \
    --batches "$2" --context "$3" --prefill 0 --reps 40 --variants "$V" "${@:5}" >"$log" 2>&1
  grep -E "^variant" "$log" | sed "s/^/$1 b$2 c$3 $4 /" |
    sed -E 's/ as a CUDA graph//; s/: a control.*|; decode.*//' | cut -c1-120
}

# Twelve chat prompts of growing length (60-1,050 characters of bench/RESULTS.md) as a
# `strata generate` input file: the graph/eager output comparisons of the check scripts.
dev_house_prompts() {
  python3 - "$1" <<'PY'
import json, sys
text = open("bench/RESULTS.md").read().replace("\n", " ")
with open(sys.argv[1], "w") as f:
    for k in range(12):
        f.write(json.dumps({"id": f"p{k}", "conversations": [{"role": "user", "content": text[k * 300:k * 300 + 60 + 90 * k]}]}) + "\n")
PY
}
