// Capacity planner: pure functions from (ModelSpec, Deployment) to a Plan (weights per rank, KV
// bytes per token, KV pool size in tokens, max running requests, host tier, headroom).
//
// `strata plan` prints Plans; the engine calls plan_kv_capacity() at startup to size its page
// pool, so the CLI and a live server agree. SGLang semantics throughout:
//   available_before_load = GPU memory - runtime_reserved (CUDA context, NCCL, all-reduce buffers)
//   static = mem_fraction_static x available_before_load      (weights + KV pool)
//   kv_pool = static - weights - load_overhead                 (what profile_max_num_token finds)
//   headroom = available_before_load - static                  (activations, CUDA graphs)
// Every term is explained in Plan::explanation.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "model/inventory.h"
#include "model/spec.h"

namespace strata {

enum class PlanDevice : uint8_t { kCuda, kCpu };

struct Deployment {
  // Per GPU; with device kCpu the engine's memory-budget flag stands in for it.
  int64_t gpu_memory_bytes = 0;
  int tp_size = 1;
  // --dcp-size: decode context parallelism (arch/dcp.h; MLA only, divides tp_size): each group of
  // dcp_size ranks holds 1/dcp_size of every sequence's latent KV, so the pool holds dcp_size x
  // the tokens of one rank's memory. The page is then page_size x dcp_size tokens (page_size: a
  // rank's pool page).
  int dcp_size = 1;
  std::optional<double> mem_fraction_static;  // nullopt: SGLang's default for this GPU size
  DType kv_cache_dtype = DType::kBF16;        // kBF16, kFP8E4M3, kFP8E5M2 or kF32
  std::vector<int> kv_bf16_layers;            // layers kept in bf16 when kv_cache_dtype is narrower
  int page_size = 1;
  int64_t hicache_bytes = 0;   // host tier per rank (--hicache-size, decimal GB as SGLang)
  double hicache_ratio = 0;    // host tier as a multiple of the device pool when bytes == 0
  int64_t context_length = 0;  // 0: the model's max_position_embeddings
  int64_t avg_seq_len = 0;     // prompt + output tokens of a typical request; 0: not given
  int64_t max_seq_len = 0;     // 0: context_length
  std::optional<int> max_running_requests;  // --max-running-requests
  std::optional<int64_t> max_total_tokens;  // --max-total-tokens: caps the KV pool
  PlanDevice device = PlanDevice::kCuda;
  bool language_only = false;  // a VL wrapper's vision tower is not loaded (SGLang --language-only)
  std::optional<int64_t> runtime_reserved_bytes;  // overrides the CUDA context + comm estimate
  std::optional<int64_t> load_overhead_bytes;     // overrides the load-time extras estimate
  int chunked_prefill_size = 0;  // 0: SGLang's default (used only for the default fraction)
  int cuda_graph_max_bs = 0;     // 0: SGLang's default (used only for the default fraction)
  // What the backend keeps of each weight format (Backend::weight_policy): the CUDA backend's by
  // default; the CPU reference dequantizes to float32.
  WeightPolicy weight_policy = kGpuWeightPolicy;
};

struct Plan {
  double mem_fraction_static = 0;
  bool mem_fraction_defaulted = false;
  DType kv_cache_dtype = DType::kBF16;
  int64_t total_params = 0;
  int64_t active_params = 0;
  int64_t weight_bytes_per_rank =
      0;  // weights one rank holds on its device (model/inventory.h device_bytes)
  int64_t load_overhead_bytes = 0;     // per rank: vision tower, MLA absorbed copies, rope cache
  int64_t runtime_reserved_bytes = 0;  // per rank, gone before weights load
  int64_t available_before_load_bytes = 0;
  int64_t static_bytes = 0;        // mem_fraction_static x available_before_load
  int64_t kv_bytes_per_token = 0;  // per rank
  int64_t profiled_kv_tokens = 0;  // before the --max-total-tokens cap and page rounding
  int64_t kv_tokens = 0;           // whole pages (the group's: kv_tokens_per_rank x dcp_size)
  int64_t kv_pool_bytes = 0;       // per rank: kv_tokens_per_rank x kv_bytes_per_token
  int dcp_size = 1;
  int64_t kv_tokens_per_rank = 0;  // whole pool pages of one rank's memory
  // Decode context parallelism's traffic per layer per new token, per rank (bf16 queries
  // all-gathered, float32 partials + LSE all-to-all); 0 at dcp_size 1.
  int64_t dcp_gather_bytes_per_token_layer = 0;
  int64_t dcp_all_to_all_bytes_per_token_layer = 0;
  // The data-parallel-attention alternative (MLA, tp > 1): every rank holds the whole attention
  // weights (the extra bytes below) and its own requests' KV, so the group holds tp x one rank's
  // tokens, but no request may outgrow one rank's pool. 0 tokens: the weights leave no room.
  int64_t dp_attention_extra_weight_bytes = 0;
  int64_t dp_attention_kv_tokens_per_rank = 0;
  int64_t context_length = 0;
  int64_t req_pool_size = 0;  // request slots (SGLang's req_to_token_pool size)
  int max_running_requests = 0;
  int64_t requests_at_avg_len = 0;  // requests whose KV fits at once at avg_seq_len (0: n/a)
  int64_t requests_at_max_len = 0;  // ... at max_seq_len
  int64_t host_tier_tokens = 0;
  int64_t host_tier_bytes = 0;
  int64_t headroom_bytes = 0;            // activations, CUDA graphs, workspaces
  std::vector<std::string> explanation;  // one line per term, for --verbose
};

// Sizes the KV pool. Errors: invalid deployment (tp < 1, fraction outside (0, 1), memory <= 0,
// page_size < 1, unsupported KV dtype, bf16 layer out of range, heads not divisible by tp) and
// ResourceExhausted when weights leave no room for one page (the message names the smallest
// mem_fraction_static that fits). Cost: builds the tensor inventory (milliseconds).
StatusOr<Plan> plan_kv_capacity(const ModelSpec& spec, const Deployment& deployment);

// KV bytes per token on one rank. GQA/MHA: 2 x max(1, kv_heads / tp) x head_dim x dtype bytes per
// layer; MLA: (kv_lora_rank + qk_rope_head_dim) x dtype bytes per layer, the same on every rank.
// Layers in `bf16_layers` use 2 bytes whatever `kv_dtype` is.
int64_t kv_bytes_per_token(const ModelSpec& spec, int tp, DType kv_dtype,
                           const std::vector<int>& bf16_layers = {});

// SGLang's default --mem-fraction-static (server_args._handle_gpu_memory_settings): reserve
// 512 MiB + 1.5 x chunked_prefill_size MiB + 2 x cuda_graph_max_bs MiB + tp/8 GiB (at least
// 10 GiB on GPUs above 60 GiB), fraction = round((mem - reserved) / mem, 3). Zero
// chunked_prefill_size / cuda_graph_max_bs take SGLang's per-GPU-size defaults.
double default_mem_fraction_static(int64_t gpu_memory_bytes, int tp_size,
                                   int chunked_prefill_size = 0, int cuda_graph_max_bs = 0);

// "bf16"/"bfloat16"/"auto" (the checkpoint's bf16), "fp8_e4m3", "fp8_e5m2", "f32"/"float32".
StatusOr<DType> parse_kv_cache_dtype(std::string_view name);
inline const char* kv_cache_dtype_name(DType dtype) { return dtype_name(dtype); }

}  // namespace strata
