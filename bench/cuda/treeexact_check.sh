#!/bin/bash
# Draft trees exact in deterministic mode (issue 26), one H200, from the repository root:
#   bash bench/cuda/treeexact_check.sh            (carry .devcarry/cuda: house-llama)
# With STRATA_CARRY=$PWD/.devcarry/all (both models) the house-mla model tests
# run too; with .devcarry/cuda they skip and say so. (2026-12-02: .devcarry/all, 61.6 MiB, and the
# tracked tree, 21.8 MB, no longer fit one call's 64 MiB.)
# (1) strata_parity_test:
#   TreeExactParity.*        deterministic paged attention (GQA) and absorbed MLA: every tree row
#                            bitwise equal to the plain row of its path (path tiles), and the
#                            controls without them (some rows must differ)
#   TreeExactModel.*         the same on house-llama's and house-mla's verify forwards: each
#                            node's logits == the plain forward of its path; the controls
#   TreeParity.*, MlaAttention.DraftTrees, *TreeModelParity*   the tree suites (tree_check.sh)
#   CudaParity.*Attention*, MlaAttention.*, MlaBackend.*       the causal suites of the kernels
#                            path tiles touched
# (2) the engine: STAGE=eagle3 EAGLE3_PARTS=det bench/cuda/spec_check.sh, greedy outputs with
# and without EAGLE3 (chain 3,1,4 and tree 3,4,8) in deterministic mode at concurrency 1, 16 and
# 64 with retraction: identical expected. Logs: $OUT/treeexact_logs.tgz, $OUT/eagle3_logs.tgz,
# $OUT/eagle3_summary.txt. About 4 minutes with the build.
set -u
source bench/cuda/device_env.sh  # OUT, C, PKG, dev_configure, dev_build
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t0=$(date +%s)
dev_configure
dev_build strata_parity_test strata
echo "build: $(( $(date +%s) - t0 )) s"
L=$OUT/treeexact
mkdir -p "$L"
run() {  # run NAME FILTER MIN_TESTS: fails loudly when the filter ran fewer tests than expected
  local t1=$(date +%s)
  timeout 300 ./build-dev/strata_parity_test --gtest_filter="$2" >"$L/$1.txt" 2>&1
  local rc=$?
  local ran=$(grep -oE '^\[==========\] [0-9]+ tests? from .* ran' "$L/$1.txt" | grep -oE '[0-9]+' | head -1)
  echo "$1: exit $rc, ${ran:-0} tests, $(( $(date +%s) - t1 )) s; $(grep -E '^\[  (PASSED|FAILED|SKIPPED)  \]' "$L/$1.txt" | tr '\n' ' ')"
  [ "${ran:-0}" -ge "$3" ] || echo "  !! $1: filter '$2' ran ${ran:-0} tests, expected >= $3"
  grep -E "^\[  FAILED  \]|Failure|CHECK|error|SKIPPED|not in this carry" "$L/$1.txt" | head -12
}
run exact_ops 'TreeExactParity.*' 4
grep -E "(exact|control).*rows differ" "$L/exact_ops.txt"
run exact_model '*TreeExactModel*' 2
grep -E "rows differ with path tiles|path tiles on: [1-9]" "$L/exact_model.txt" | head -16
run tree_ops 'TreeParity.*:MlaAttention.DraftTrees' 5
run tree_models '*TreeModelParity*' 2
run causal_regression 'CudaParity.*Attention*:MlaAttention.*:MlaBackend.*' 6
tar czf "$OUT/treeexact_logs.tgz" -C "$OUT" treeexact && rm -rf "$L"
echo "tests: $(( $(date +%s) - t0 )) s"
STAGE=eagle3 EAGLE3_PARTS=det bash bench/cuda/spec_check.sh 2>&1 | grep -vE "^ +(ms per step|CUDA graphs)"
echo "total: $(( $(date +%s) - t0 )) s"
