#!/bin/bash
# Runs on the GPU machine (the device tool) from the repository root: unpacks the carried
# pcre2/pkgconf .debs (the image has neither), configures and builds the CUDA targets, then runs
# the stages named in $@: parity (tests/parity), bench (bench/cuda/llama_bench.cc), profile
# (per-op device time of a decode step, 4 layers of 8B shape), sdpa (PyTorch SDPA reference),
# generate (strata generate --device cuda on house-llama, bf16 and fp8_e4m3 KV), offline (the
# engine's offline throughput, bench/cuda/offline_bench.cc; OFFLINE_ARGS adds flags), hf (Hugging
# Face generate baseline, bench/cuda/hf_generate_bench.py). Logs go to $OUT.
# Carry: .devcarry/cuda (debs/ and shared/: the models and fixtures the tests read).
set -u
source bench/cuda/device_env.sh  # OUT, C, P, PKG; carried deps unpacked
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
t0=$(date +%s)
dev_configure
dev_build strata_parity_test strata_bench_llama_bench strata_bench_offline_bench strata
echo "build: $(( $(date +%s) - t0 )) s"
for stage in "$@"; do
  case $stage in
    parity)
      # Into a file first: a pipe closed early (head) would kill the suite with SIGPIPE mid-run.
      ./build-dev/strata_parity_test --gtest_filter=${PARITY_FILTER:-*} >"$OUT/parity.log" 2>&1
      echo "parity: exit status $?"
      grep -E "nmse|agreement|greedy|graph|kv_write|refused|OK|FAILED|PASSED|Failure|error|Expected|Which is|actual" \
        "$OUT/parity.log" | tail -150 ;;
    bench)
      ./build-dev/strata_bench_llama_bench --what ${BENCH_WHAT:-ceilings,gemv,attention,decode} 2>&1 | tee "$OUT/bench.log" ;;
    profile)
      ./build-dev/strata_bench_llama_bench --what profile --steps 16 \
        --config $C/shared/configs/llama-3.1-8b-4layers/config.json 2>&1 | tee "$OUT/profile.log" ;;
    sdpa)
      python3 bench/cuda/sdpa_bench.py 2>&1 | tee "$OUT/sdpa.log" ;;
    generate)
      ./build-dev/strata generate --device cuda --model-path $C/shared/models/house-llama \
        --prompt "What is the Linux kernel?" --max-new-tokens 32 --mem-fraction-static 0.8 --no-progress 2>&1 | tail -20 | tee "$OUT/generate.log"
      ./build-dev/strata generate --device cuda --model-path $C/shared/models/house-llama \
        --prompt "What is the Linux kernel?" --max-new-tokens 32 --mem-fraction-static 0.8 --no-progress \
        --kv-cache-dtype fp8_e4m3 --allow-lossy-kv 2>&1 | tail -20 | tee -a "$OUT/generate.log" ;;
    offline)
      ./build-dev/strata_bench_offline_bench --config $C/shared/configs/llama-3.1-8b/config.json \
        --tokenizer $C/shared/models/house-llama ${OFFLINE_ARGS:-} 2>&1 | tee -a "$OUT/offline.log" ;;
    hf)
      python3 bench/cuda/hf_generate_bench.py $C/shared/configs/llama-3.1-8b ${HF_ARGS:-} 2>&1 | grep -v Warning | tee "$OUT/hf.log" ;;
  esac
done
