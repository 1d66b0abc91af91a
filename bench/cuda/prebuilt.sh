#!/bin/bash
# Benchmarks built on the CPU machine and carried to the GPU machine, so that a device call spends
# none of the session's device time building (2026-12-06: one call ran moe_bench built here three
# ways, with ncu, in 51 s; building it there takes minutes). The CPU machine's CUDA (13.0) is the
# device image's; the binaries need GLIBC <= 2.34 and take libfmt and libspdlog from the carry
# (lib/), and Debian's libstdc++ (lib2/) only if the image's does not load them. A program linked
# without the backend through --unresolved-symbols did not load there ("unexpected PLT reloc"):
# pack the CMake targets as they are (build-cuda: the Release CUDA build). Programs that read
# ../shared (the parity tests' fixtures, offline_bench's tokenizer) look where it was here,
# STRATA_SHARED_DIR as compiled: on the device link that path to the carried shared/, or build
# them there.
#   here:   bash bench/cuda/prebuilt.sh pack NAME [PATCH:]TARGET...
#           builds each TARGET (e.g. strata_bench_moe_bench) in build-cuda, with PATCH applied for
#           that build and reverted after (an A/B binary: PATCH_TARGET), strips it and xz's it
#           into .devcarry/NAME (~12 MB a benchmark; carry it, with the tracked tree under 64 MiB;
#           strata_bench_kit holds mla, moe, rank_step and int4_linear benches in ~12 MB, and
#           unpack links their names to it)
#   device: source bench/cuda/prebuilt.sh unpack NAME
#           unpacks them into $PB (/tmp/prebuilt) and sets LD_LIBRARY_PATH; returns 1 if ldd
#           finds the first one's libraries missing (then build there: device_env.sh)
#           bash bench/cuda/prebuilt.sh link-shared .devcarry/fxd (or prebuilt_link_shared once
#           sourced): the carried fixtures and configs where the parity binaries look for them
#           source bench/cuda/prebuilt.sh; prebuilt_begin NAME [CARRY_DIR]: a session script's
#           start (OUT, t0, the pack unpacked, the fixtures linked, $gpu); then prebuilt_left,
#           prebuilt_h200_rows RESERVE_S and prebuilt_end NAME (below)
prebuilt_pack() {
  local name=$1 dir spec patch target out
  shift
  dir=.devcarry/$name
  rm -rf "$dir" && mkdir -p "$dir/lib" "$dir/lib2"
  cp -L /lib/x86_64-linux-gnu/libfmt.so.9 /lib/x86_64-linux-gnu/libspdlog.so.1.10 "$dir/lib/"
  cp -L /lib/x86_64-linux-gnu/libstdc++.so.6 "$dir/lib2/"
  # What was packed, for the device log: the commit, whether the tree differed, each binary's patch.
  echo "packed $(date -u +%FT%TZ) at $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src bench || echo ' + uncommitted changes')" \
    >"$dir/MANIFEST"
  # The checkout the binaries were built from: the parity tests read the repository's fixtures
  # there (STRATA_REPO_FIXTURES_DIR as compiled); prebuilt_begin links the device's checkout to it.
  echo "$PWD" >"$dir/SOURCE_DIR"
  for spec in "$@"; do
    patch="" target=$spec out=$spec
    if [[ $spec == *:* ]]; then
      patch=${spec%%:*} target=${spec#*:}
      out=$(basename "$patch" .patch)_$target
      git apply "$patch" || return 1
    fi
    cmake --build build-cuda --target "$target" >/dev/null || { [ -z "$patch" ] || git apply -R "$patch"; return 1; }
    [ -z "$patch" ] || git apply -R "$patch"
    strip -o "/tmp/$out" "build-cuda/$target" && xz -T2 -6 -c "/tmp/$out" >"$dir/$out.xz"
    rm -f "/tmp/$out"
    echo "$out: $target${patch:+ with $patch}" >>"$dir/MANIFEST"
    echo "$dir/$out.xz: $(du -h "$dir/$out.xz" | cut -f1)"
  done
  # The last target rebuilt against the restored tree (the others rebuild when next built).
  [ $# -eq 0 ] || cmake --build build-cuda --target "${target}" >/dev/null
}

prebuilt_unpack() {
  local dir=$PWD/.devcarry/$1 f bin first="" base=${LD_LIBRARY_PATH:-} libs
  export PB=/tmp/prebuilt
  mkdir -p "$PB"
  for f in "$dir"/*.xz; do
    bin=$PB/$(basename "$f" .xz)
    python3 -c "import lzma, sys; open(sys.argv[2], 'wb').write(lzma.open(sys.argv[1]).read())" \
      "$f" "$bin"
    chmod +x "$bin"
    [ -n "$first" ] || first=$bin
  done
  # strata_bench_kit (bench/cuda/kit/kit_main.cc) answers to its benchmarks' own names.
  if [ -x "$PB/strata_bench_kit" ]; then
    for f in mla_bench moe_bench rank_step_bench int4_linear_bench; do
      [ -e "$PB/strata_bench_$f" ] || ln -s strata_bench_kit "$PB/strata_bench_$f"
    done
  fi
  cat "$dir/MANIFEST" 2>/dev/null
  # ldd names a missing library or symbol version ("version `GLIBCXX_3.4.30' not found").
  for libs in "$dir/lib" "$dir/lib2:$dir/lib"; do
    export LD_LIBRARY_PATH=$libs${base:+:$base}
    ldd "$first" 2>&1 | grep -q "not found" || return 0
  done
  echo "prebuilt: $first does not load here"
  return 1
}

# The carried shared/{fixtures,configs} (a carry dir with shared/ inside, e.g. .devcarry/fxd) at the
# path the binaries were compiled to read them from (STRATA_SHARED_DIR: /work/main/../shared).
prebuilt_link_shared() {
  local d
  mkdir -p /work/shared
  for d in fixtures configs; do [ -e /work/shared/$d ] || ln -s "$1/shared/$d" /work/shared/$d; done
}

# The common start of a session's device script (source prebuilt.sh, then call it): OUT made,
# t0 set, the pack NAME unpacked into $PB (BIN too), the carried fixtures CARRY (a .devcarry dir,
# optional) linked, the checkout linked where the binaries were built (the pack's SOURCE_DIR: the
# parity tests read the repository's fixtures there), and the GPU's name in $gpu and on stdout.
# Returns 1 where the pack does not load.
prebuilt_begin() {
  OUT=${OUT:-/tmp/strata_out}
  mkdir -p "$OUT"
  t0=$(date +%s)
  prebuilt_unpack "$1" || return 1
  BIN=$PB
  [ -z "${2:-}" ] || prebuilt_link_shared "$2"
  local src
  src=$(cat "$PWD/.devcarry/$1/SOURCE_DIR" 2>/dev/null || echo /work/main)
  [ -e "$src" ] || { mkdir -p "$(dirname "$src")" && ln -s "$PWD" "$src"; }
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader)
  echo "gpu: $gpu"
}

# Seconds left of the call's limit (BUDGET_S, default 575) since prebuilt_begin.
prebuilt_left() { echo $(( ${BUDGET_S:-575} - $(date +%s) + t0 )); }

# On an H200 only (elsewhere nothing, unless ROWS_ANY_GPU is set): the rows bench/RESULTS.md
# judges on an H200 — session10_check's stages ROW_STAGES (default "llama kimi moonlight mla":
# Llama-3.1-8B W4A16 batch 1, the Kimi-K2.5 rank at batch 1 from its 4- and 12-layer cuts,
# Moonlight batch 1, the MLA acceptance) with the pack PREBUILT and the carry C — leaving RESERVE
# ($1) seconds of the call. Other session10_check variables (MOONLIGHT_VARIANTS, ...) pass
# through the environment.
prebuilt_h200_rows() {
  [[ $gpu == *H200* || -n ${ROWS_ANY_GPU:-} ]] || return 0
  local limit=$(( $(prebuilt_left) - $1 ))
  # (timeout 0 would mean no limit at all)
  [ "$limit" -ge 30 ] || { echo "[rows skipped: ${limit} s left for them]"; return 0; }
  STRATA_CARRY=$C OUT=$OUT/rows STAGES="${ROW_STAGES:-llama kimi moonlight mla}" PREBUILT=$PREBUILT \
    LLAMA_CONFIG=llama-3.1-8b-w4a16 KIMI_CUTS="4 12" KIMI_BATCHES=1 \
    timeout "$limit" bash bench/cuda/session10_check.sh 2>&1 |
    grep -vE "NMSE|^\s*$" | cut -c1-220
  echo "[rows @$(( $(date +%s) - t0 )) s]"
}

# The end of a session's device script NAME ($1): its total time; the logs into $OUT/logs.tgz.
prebuilt_end() {
  echo "[$1 total @$(( $(date +%s) - t0 )) s]"
  tar czf /tmp/logs.tgz -C "$OUT" . && mv /tmp/logs.tgz "$OUT/" &&
    find "$OUT" -maxdepth 1 -name "*.log" -delete
}

case "${1:-}" in
  pack) shift; prebuilt_pack "$@" ;;
  unpack) shift; prebuilt_unpack "$@" ;;
  link-shared) shift; prebuilt_link_shared "$@" ;;
  "") ;;  # sourced for its functions (prebuilt_begin)
  *) echo "usage: bash bench/cuda/prebuilt.sh pack NAME [PATCH:]TARGET... | source ... unpack NAME | link-shared CARRY_DIR" ;;
esac
