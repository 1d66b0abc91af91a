# Hugging Face transformers `generate` on the same GPU: the side-by-side baseline of the offline
# throughput benchmark (bench/cuda/offline_bench.cc). Random bf16 weights of a config's shape
# (Llama-3.1-8B, or a DeepSeek-V3-architecture model such as Moonlight through transformers' own
# DeepseekV3ForCausalLM; built on the device, uniform ±0.02 like strata's; buffers such as rotary
# frequencies keep their computed values, the router's correction bias its zeros), prompts
# of random token ids, greedy, fixed output length (EOS disabled), SDPA attention, default
# (dynamic) KV cache. A few batches give its rate: output tokens / wall seconds of each generate.
#
# Usage: python3 bench/cuda/hf_generate_bench.py CONFIG_DIR [--batches 64,128] [--in 1024] [--out 256]
import argparse
import time

import torch
from transformers import AutoConfig, AutoModelForCausalLM

ap = argparse.ArgumentParser()
ap.add_argument("config_dir")
ap.add_argument("--batches", default="64,128")
ap.add_argument("--in", dest="n_in", type=int, default=1024)
ap.add_argument("--out", dest="n_out", type=int, default=256)
a = ap.parse_args()

cfg = AutoConfig.from_pretrained(a.config_dir)
cfg.torch_dtype = torch.bfloat16
cfg.quantization_config = None  # random bf16 weights: the shape, not the stored format
if hasattr(cfg, "auto_map"):
    del cfg.auto_map  # transformers' own implementation, not the checkpoint's remote code
torch.manual_seed(0)
torch.set_default_dtype(torch.bfloat16)
with torch.device("cuda"):
    model = AutoModelForCausalLM.from_config(cfg)
torch.set_default_dtype(torch.float32)
with torch.no_grad():
    for p in model.parameters():
        p.uniform_(-0.02, 0.02)
model.eval()
model.generation_config.eos_token_id = None
model.generation_config.pad_token_id = 0
import transformers
print(f"hf       transformers {transformers.__version__}, torch {torch.__version__}, attn {model.config._attn_implementation}")

for b in [int(x) for x in a.batches.split(",")]:
    ids = torch.randint(0, cfg.vocab_size, (b, a.n_in), device="cuda")
    mask = torch.ones_like(ids)
    with torch.no_grad():
        model.generate(ids[:, :32], attention_mask=mask[:, :32], max_new_tokens=4, do_sample=False)
        torch.cuda.synchronize()
        t = time.time()
        out = model.generate(ids, attention_mask=mask, max_new_tokens=a.n_out, min_new_tokens=a.n_out,
                             do_sample=False)
        torch.cuda.synchronize()
        dt = time.time() - t
    n = (out.shape[1] - a.n_in) * b
    print(f"hf       generate batch {b}, {a.n_in} in / {a.n_out} out, greedy: {n} output tokens in "
          f"{dt:.1f} s = {n / dt:.0f} output tok/s", flush=True)
    del out
    torch.cuda.empty_cache()
