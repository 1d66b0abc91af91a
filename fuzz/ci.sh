#!/usr/bin/env bash
# CI's sanitizer + fuzz stage (called by .ci/run after the main build and ctest; FUZZING.md).
# One clang build dir with ASan+UBSan and libFuzzer coverage (-DSTRATA_FUZZ=ON) builds the
# unit tests and the fuzz targets from a single compile of the libraries (no CUDA, no e2e, no
# golden tests), runs every unit test under the sanitizers, then each fuzz target for a bounded
# time over its seed corpus.
# Env: STRATA_FUZZ_BUILD (build dir, default build-fuzz), STRATA_FUZZ_SECONDS (per target,
# default 15), STRATA_FUZZ_JOBS (targets at once, default 2), STRATA_FUZZ_OPT (default -O0:
# with the sanitizers, -O1 doubles the compile time, which CI's 2 cores cannot afford).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${STRATA_FUZZ_BUILD:-build-fuzz}
secs=${STRATA_FUZZ_SECONDS:-15}
jobs=${STRATA_FUZZ_JOBS:-2}
opt=${STRATA_FUZZ_OPT:--O0}
t0=$(date +%s)

# Precompiled headers (STRATA_PCH): at -O0 under the sanitizers about 30 % of the compile time is
# parsing the same standard, gtest and json headers. lld (scripts/setup.sh installs it) links the
# ASan binaries about 4x faster than ld.bfd.
link=()
command -v ld.lld >/dev/null 2>&1 && link=(-DCMAKE_EXE_LINKER_FLAGS=-fuse-ld=lld)
cmake -S . -B "$build" -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$opt -gline-tables-only" \
  -DSTRATA_FUZZ=ON -DSTRATA_PCH=ON "${link[@]}" >/dev/null
units=()
for d in tests/unit/*/; do units+=("strata_unit_$(basename "$d")_test"); done
cmake --build "$build" -j"$(nproc)" --target "${units[@]}" strata_fuzz_all
t1=$(date +%s)

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# Left out here (the main build's ctest runs them): PlanCli runs the strata CLI, which this build
# does not make; KvEval, KvEvalTp (eval-kv at tp 1 and 2 on both house models), PagedRunner, the
# KV gate on the house model, CaptureEngine (engines capturing every layer) and the house models'
# CaptureTest (40 s each under ASan) run many model forward passes, up to ~10 minutes each under
# ASan on 2 cores. Also left out: the speculative samplers' chi-squared tests (200,000 drawn
# sequences each, 14-27 s apiece under ASan, 106 s in all); the same code runs under the
# sanitizers in their modules' other tests (SameDrawsGiveThePlainSamplersTokens, TreeVerify.*).
# Every module keeps its other tests. CI's whole run stays under ~35 minutes.
ctest --test-dir "$build" -L unit --output-on-failure -j2 --timeout 600 \
  -E '^(PlanCli|KvEval|KvEvalTp|PagedRunner|CaptureEngine)\.|^KvGate\.EnforcedOnTheHouseModel|^HouseModels/CaptureTest\.|^(Tree)?SpeculativeSampling\.(.*MatchesTheTargetDistribution|TheTestRejects.*)$'

t2=$(date +%s)

fuzz/run.sh -b "$build" -t "$secs" -j "$jobs"
t3=$(date +%s)
echo "sanitizer+fuzz stage: build $((t1 - t0)) s, unit tests under ASan+UBSan $((t2 - t1)) s, fuzz $((t3 - t2)) s"
