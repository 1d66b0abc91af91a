#!/bin/bash
# DeepSeek-V3-architecture models end to end on one H200 (issue 24), from the repository root on
# the GPU machine, `.devcarry/cuda` carried (debs, shared/configs, shared/models/house-llama for the
# tokenizer files, shared/data). Random weights in the stored format at run time: offline_bench
# writes a sparse zero checkpoint and fills the loaded device copies with uniform ±0.02 values
# (CudaBackend::fill_all_random); strata_bench_make_checkpoint writes the same distribution into
# a real file for `strata generate`. Routing sees random router rows and random hidden states, so
# experts are spread about uniformly (a trained model's routing is more skewed, which only helps a
# batch's expert reuse: the uniform spread is the harder case for decode).
#
# Stages (STAGES, default "ceilings moonlight moonlight_w4a16 v2lite batch1 hf generate"):
#   ceilings         copy bandwidth and bf16 GEMM rate (llama_bench --what ceilings)
#   moonlight        offline 1,000 x 1,024 random tokens in / 1,024 out, bf16 KV, bf16 weights
#   moonlight_w4a16  the same with the routed experts INT4 group 32 (Kimi-K2.5's
#                    quantization_config on the Moonlight shape)
#   v2lite           the same on DeepSeek-V2-Lite's shape
#   batch1           1 prompt x 512 in / 512 out through the engine (CUDA graphs), and the
#                    active-weight streaming limit it is measured against
#   hf               transformers generate on the same random Moonlight shape, a few batches
#   generate         strata generate on a random Moonlight checkpoint, 1,000 short chat prompts x
#                    1,024 tokens (--ignore-eos), next to offline_bench at the same shape
# MAX_SECONDS (default 150) caps each offline run (the rate is then over the tokens made so far).
set -u
source bench/cuda/device_env.sh
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader
t0=$(date +%s)
dev_configure
dev_build strata strata_bench_offline_bench strata_bench_llama_bench strata_bench_make_checkpoint
echo "build: $(( $(date +%s) - t0 )) s"
CFG=$C/shared/configs
MS=${MAX_SECONDS:-150}
W=/tmp/ds_e2e
mkdir -p "$W"

# The Moonlight shape with INT4 experts: Kimi-K2.5's compressed-tensors config (attention, shared
# experts, dense MLPs and lm_head kept bf16) on Moonlight's config.
python3 - "$CFG" "$W/moonlight-w4a16" <<'PY'
import json, os, sys
cfg, out = sys.argv[1], sys.argv[2]
m = json.load(open(f"{cfg}/moonlight-16b-a3b/config.json"))
k = json.load(open(f"{cfg}/kimi-k2.5/config.json"))
q = k.get("quantization_config") or k["text_config"]["quantization_config"]
m["quantization_config"] = q
os.makedirs(out, exist_ok=True)
json.dump(m, open(f"{out}/config.json", "w"), indent=1)
PY

offline() {  # NAME CONFIG ARGS...
  local name=$1 cfg=$2
  shift 2
  timeout $((MS + 120)) ./build-dev/strata_bench_offline_bench --config "$cfg" --tokenizer "$C/shared/models/house-llama" \
    --max-seconds "$MS" --breakdown-batch 0 "$@" >"$OUT/offline_$name.log" 2>&1
  echo "$name: rc $?"
  grep -E "^engine|^offline|CPU fallback|CUDA graphs:|error|CHECK" "$OUT/offline_$name.log" | head -8
}

for stage in ${STAGES:-ceilings moonlight moonlight_w4a16 v2lite batch1 hf generate}; do
  t1=$(date +%s)
  case $stage in
    ceilings)
      ./build-dev/strata_bench_llama_bench --what ceilings >"$OUT/ceilings.log" 2>&1
      grep -E "^ceiling" "$OUT/ceilings.log" ;;
    moonlight) offline moonlight "$CFG/moonlight-16b-a3b/config.json" --prompts 1000 --in 1024 --out 1024 ;;
    moonlight_w4a16) offline moonlight_w4a16 "$W/moonlight-w4a16/config.json" --prompts 1000 --in 1024 --out 1024 ;;
    v2lite) offline v2lite "$CFG/deepseek-v2-lite/config.json" --prompts 1000 --in 1024 --out 1024 ;;
    batch1)
      offline batch1 "$CFG/moonlight-16b-a3b/config.json" --prompts 1 --in 512 --out 512
      offline batch1_w4a16 "$W/moonlight-w4a16/config.json" --prompts 1 --in 512 --out 512
      # Bytes one decode token must read: every weight but the routed experts and the embedding
      # table, plus top_k of the routed experts in each MoE layer (and one embedding row).
      python3 - "$CFG/moonlight-16b-a3b/config.json" "$OUT/ceilings.log" <<'PY'
import json, re, sys
c = json.load(open(sys.argv[1]))
H, L, V = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
nh, R, P = c["num_attention_heads"], c["kv_lora_rank"], c["qk_rope_head_dim"]
dn, dv = c["qk_nope_head_dim"], c["v_head_dim"]
ql = c.get("q_lora_rank")
attn = (H * ql + ql * nh * (dn + P) if ql else H * nh * (dn + P)) + H * (R + P) + R * nh * (dn + dv) + nh * dv * H
dense = 3 * H * c["intermediate_size"]
expert = 3 * H * c["moe_intermediate_size"]
k, shared, E = c["num_experts_per_tok"], c.get("n_shared_experts", 0), c["n_routed_experts"]
first = c.get("first_k_dense_replace", 0)
per_moe = expert * (k + shared) + H * E
active = L * attn + first * dense + (L - first) * per_moe + V * H  # + lm_head
bytes_ = 2 * active
m = re.search(r"D2D copy (\d+) GB/s", open(sys.argv[2]).read()) if len(sys.argv) > 2 else None
bw = float(m.group(1)) if m else 4230.0
print(f"limit    moonlight batch-1 decode reads {bytes_ / 1e9:.2f} GB of bf16 weights a token (active params "
      f"{active / 1e9:.2f} B): {bw:.0f} GB/s copy bandwidth -> {bw * 1e9 / bytes_:.0f} tok/s streaming limit, "
      f"60% of it {0.6 * bw * 1e9 / bytes_:.0f} tok/s")
PY
      ;;
    hf)
      timeout 300 python3 bench/cuda/hf_generate_bench.py "$CFG/moonlight-16b-a3b" --batches ${HF_BATCHES:-16,64} --in 1024 \
        --out ${HF_OUT:-32} >"$OUT/hf.log" 2>&1
      echo "hf: rc $?"; grep -E "^hf|Error|error" "$OUT/hf.log" | head -8 ;;
    generate)
      ./build-dev/strata_bench_make_checkpoint --config "$CFG/moonlight-16b-a3b/config.json" --out "$W/moonlight-random" \
        --tokenizer "$C/shared/models/house-llama" | tee "$OUT/make_checkpoint.log"
      head -1000 "$C/shared/data/prompts-explain.jsonl" >"$W/prompts.jsonl"
      timeout $((MS + 120)) ./build-dev/strata generate --device cuda --model-path "$W/moonlight-random" \
        --input "$W/prompts.jsonl" -o "$W/gen_out.jsonl" --max-new-tokens 1024 --ignore-eos --temperature 0 \
        --progress-interval 10 >"$OUT/generate.log" 2>&1
      echo "generate: rc $?"
      grep -E "finished in|prompt tokens|CPU fallback|CUDA graphs:|error" "$OUT/generate.log" | head -6
      python3 -c "import json,sys; r=[json.loads(l) for l in open('$W/gen_out.jsonl')]; print('generate: %d records, mean prompt %.0f tokens' % (len(r), sum(x['meta']['prompt_tokens'] for x in r)/max(1,len(r))))"
      rm -rf "$W/moonlight-random"
      offline engine_short "$CFG/moonlight-16b-a3b/config.json" --prompts 1000 --in ${SHORT_IN:-30} --out 1024 ;;
  esac
  echo "-- $stage: $(( $(date +%s) - t1 )) s"
done
echo "total: $(( $(date +%s) - t0 )) s"
