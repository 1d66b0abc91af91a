#!/bin/bash
# Preemption with KV checkpoints on the GPU (issue 30): house-llama, 64 records of 4,000 tokens,
# `kill -9` every 2 s, the job restarted at once each time; each restart loads the unfinished
# records' KV rows from OUTPUT.partial.kv (downloaded from the GPU as their pages filled) and
# decodes on. Prints the identical records of 64 against an uninterrupted run, and the control:
# a second uninterrupted run against the first (run-to-run determinism of the kernels alone).
# Greedy by default; TEMPS="0 0.8" adds seeded sampling (about twice the time). The last run's
# log line "KV checkpoints: X MB of rows downloaded in S s (R MB/s)" is the download's cost.
# From the repository root on the GPU machine (carry .devcarry/cuda: house-llama, data/); under
# 4 minutes with the build; logs and the runs' files in $OUT.
# GEN_FLAGS=--enable-deterministic-inference: the batch-invariant kernels, where every record
# should come back identical (the restarted job's batches differ from the uninterrupted run's).
set -u
source bench/cuda/device_env.sh  # OUT, C, PKG, dev_configure, dev_build
t0=$(date +%s)
dev_configure
dev_build strata
echo "build: $(( $(date +%s) - t0 )) s"
DEVICE=cuda SHARED=$C/shared RECORDS=${RECORDS:-64} TOKENS=${TOKENS:-4000} KILL_EVERY=${KILL_EVERY:-2} \
  MAX_KILLS=${MAX_KILLS:-40} CHECKPOINT_INTERVAL=${CHECKPOINT_INTERVAL:-0.5} TEMPS="${TEMPS:-0}" CONTROL=1 \
  KEEP="$OUT/runs" timeout 200 bash bench/preemption_soak.sh build-dev/strata 2>&1 | tee "$OUT/preemption.log"
echo "preemption: exit status ${PIPESTATUS[0]}"
grep -h "KV checkpoints" "$OUT"/runs/*.log 2>/dev/null | sed 's/^.*KV checkpoints/KV checkpoints/' | sort | uniq -c | head -8
echo "total: $(( $(date +%s) - t0 )) s"
