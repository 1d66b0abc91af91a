#!/bin/bash
# The penalties and logit_bias on the GPU (issue 29; backend/cuda/sampling.cu edit_logits), from
# the repository root on the GPU machine (carry .devcarry/cuda): (1) the parity tests of the edit
# kernel against the CPU reference on bf16 and float32 logits, and house-llama's forward_sample
# with edits (tests/parity/logit_edits_parity_test.cc), plus the existing sampling parity test of
# forward_sample; (2) `strata generate --device cuda` with every new sampling flag: a logit_bias of
# +100 on token 1000 (" requ") must produce only that token, a seeded run with the penalties must
# give the same text twice, and greedy outputs without edits must still equal the graph-mode ones
# (requests with edits run eagerly). Under 4 minutes; logs in $OUT.
set -u
source bench/cuda/device_env.sh  # OUT, C, PKG, dev_configure, dev_build
t0=$(date +%s)
dev_configure
dev_build strata_parity_test strata
echo "build: $(( $(date +%s) - t0 )) s"
./build-dev/strata_parity_test --gtest_filter='CudaLogitEdits.*:CudaSampling.HouseLlamaForwardSample' \
  >"$OUT/parity.log" 2>&1
echo "parity: exit status $?"
grep -E "edit_logits|sampling house|OK|FAILED|PASSED|Failure|Expected|got" "$OUT/parity.log" | tail -40
gen() {
  ./build-dev/strata generate --device cuda --model-path $C/shared/models/house-llama --mem-fraction-static 0.5 \
    --no-progress --prompt "What is the Linux kernel?" --max-new-tokens 8 "$@" 2>"$OUT/gen_err.log"
  echo "  (exit $?)"; grep -E "error|CHECK" "$OUT/gen_err.log" | head -3
}
echo "forced token 1000 (expect ' requ' x 8):"; gen --temperature 0 --logit-bias '{"1000": 100}'
echo "penalties, seeded, twice (expect the same text):"
for i in 1 2; do
  gen --temperature 0.8 --seed 5 --top-k 40 --min-p 0.05 --repetition-penalty 1.3 --presence-penalty 0.5 \
    --frequency-penalty 0.4 --logit-bias '{"13": -5}'
done
echo "greedy, graphs on and off (expect the same text):"
gen --temperature 0; gen --temperature 0 --cuda-graph-max-bs 0
echo "total: $(( $(date +%s) - t0 )) s"
