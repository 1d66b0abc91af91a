#!/bin/bash
# Builds the folders the device scripts carry (git-ignored, under .devcarry/), from the repository
# root on the development machine, beside ../shared. The GPU image lacks pcre2 and pkg-config, so
# their Debian packages travel too (device_env.sh unpacks them). A call carries at most 64 MiB:
#   .devcarry/cuda  debs, shared/{configs,data,fixtures}, models/house-llama            (~40 MB)
#   .devcarry/mla   debs, shared/{configs,data,fixtures}, models/house-mla              (~52 MB)
#   .devcarry/all   debs, shared/{configs,data,fixtures}, models.tar.xz of both models  (~62 MB)
#   .devcarry/fx    debs, shared/{configs,data,fixtures}, no model                      (~16 MB)
#   .devcarry/fxs   fx without data/ and fixtures/house-llama (MoE, DeepSeek suites)     (~9 MB)
#   .devcarry/bench debs, shared/configs only (benches that make their weights)          (~2 MB)
#   .devcarry/gen   debs, shared/configs, prompts-explain.jsonl, house-llama's tokenizer  (~3 MB)
#   .devcarry/mlaslim  debs, shared/configs, fixtures/house-mla, models/house-mla        (~45 MB)
#   .devcarry/llslim   debs, shared/configs, models/house-llama                          (~30 MB)
#   .devcarry/llfx  llslim with fixtures/{tiny,house-llama}: the Llama fixture suites     (~37 MB)
# The repository's tracked files (~22.5 MB) travel too: with .devcarry/cuda (~44.5 MB) the call
# is over the limit since 2026-12-04 (refused), with .devcarry/mla or all too (their house-model
# tests need a slimmer repository, as mlaslim below). Suites that read no house model (MoE, MLA
# kernels, the DeepSeek fixtures, rank_step_bench, moe_bench) take .devcarry/fx.
# mlaslim (house-mla's engine and model tests, e.g. MlaEngine.*:MlaModelLong.*:*/house_mla) fits
# beside a tree without its five largest tracked files (13.6 MB of hidden-state, EAGLE-3 and tiny
# fixture weights those tests do not read): remove them before the call and restore them after,
#   rm tests/fixtures/hidden_states/*.safetensors tests/fixtures/eagle3/house-llama/model.safetensors \
#      tests/fixtures/tiny/{deepseek-v3-fp8-block,llama-w4a16}/model.safetensors
#   ... the device call ...;  git checkout -- tests/fixtures
# Usage: bash bench/cuda/make_carry.sh [cuda|mla|all|fx|fxs|bench|gen|mlaslim|llslim|llfx]...   (default: cuda mla all)
set -eu
S=../shared
debs() {
  mkdir -p "$1/debs"
  (cd "$1/debs" && apt-get download libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3 \
    libpcre2-dev pkgconf pkgconf-bin libpkgconf3 >/dev/null)
}
common() {
  rm -rf "$1" && mkdir -p "$1/shared"
  debs "$1"
  cp -r $S/configs $S/data $S/fixtures "$1/shared/"
}
for what in ${@:-cuda mla all}; do
  d=.devcarry/$what
  common $d
  case $what in
    cuda) mkdir -p $d/shared/models && cp -r $S/models/house-llama $d/shared/models/ ;;
    mla) mkdir -p $d/shared/models && cp -r $S/models/house-mla $d/shared/models/ ;;
    all) (cd $S/models && tar cf - house-llama house-mla) | xz -9 -T2 >$d/shared/models.tar.xz ;;
    fx) ;;
    fxs) rm -rf $d/shared/data $d/shared/fixtures/house-llama ;;  # beside two prebuilt programs
    mlaslim)
      rm -rf $d/shared/data $d/shared/fixtures/* && cp -r $S/fixtures/house-mla $d/shared/fixtures/
      mkdir -p $d/shared/models && cp -r $S/models/house-mla $d/shared/models/ ;;
    bench) rm -rf $d/shared/data $d/shared/fixtures ;;
    llslim)  # house-llama's CUDA tests that read no fixture (e.g. *ForwardSample*, CudaSampling.*)
      rm -rf $d/shared/data $d/shared/fixtures
      mkdir -p $d/shared/models && cp -r $S/models/house-llama $d/shared/models/ ;;
    llfx)  # the Llama fixture suites (CudaModel*, QuantModel, CudaEagle3) beside a build
      rm -rf $d/shared/data $d/shared/fixtures/house-mla
      mkdir -p $d/shared/models && cp -r $S/models/house-llama $d/shared/models/ ;;
    gen)  # generate_check.sh: the prompts and a tokenizer, no weights
      rm -rf $d/shared/fixtures && find $d/shared/data -type f ! -name prompts-explain.jsonl -delete
      mkdir -p $d/shared/models/house-llama
      cp $S/models/house-llama/{config.json,generation_config.json,chat_template.jinja,tokenizer.json,tokenizer_config.json} \
        $d/shared/models/house-llama/ ;;
  esac
  echo "$d: $(du -sb $d | awk '{printf "%.1f MiB", $1 / 1048576}')"
done
