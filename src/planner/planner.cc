#include "planner/planner.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace strata {
namespace {

constexpr int64_t kMiB = int64_t(1) << 20;
constexpr int64_t kGiB = int64_t(1) << 30;

// Free memory a CUDA process loses before SGLang measures `total_gpu_memory` (the available
// memory after torch.distributed init): the CUDA context with cuBLAS/kernels (~0.97 GiB), plus,
// with TP, NCCL communicators and the custom all-reduce IPC buffers (~1.25 GiB). Both measured
// from an SGLang TP-8 log on H100-80GB (79.65 GiB): "Init torch distributed ends. mem usage=1.25
// GB" followed by "Load weight begin. avail mem=77.43 GB".
constexpr int64_t kCudaContextBytes = 993 * kMiB;
constexpr int64_t kDistInitBytes = 1280 * kMiB;

// Vision towers SGLang loads (replicated on every rank) with a VL wrapper unless
// --language-only. Kimi-K2.5: MoonViT + patch-merger projector, about 0.9 GiB in bf16.
struct VisionTower {
  const char* model_type;
  int64_t bytes;
};
constexpr VisionTower kVisionTowers[] = {
    {"kimi_k25", 922 * kMiB},
};

std::string gib(int64_t bytes) { return fmt::format("{:.2f} GiB", double(bytes) / kGiB); }

int kv_dtype_bytes(DType d) { return dtype_size(d); }

Status validate(const ModelSpec& spec, const Deployment& d) {
  if (d.tp_size < 1) return invalid_argument("tp_size must be >= 1, got {}", d.tp_size);
  if (d.gpu_memory_bytes <= 0) {
    return invalid_argument("GPU memory must be positive, got {} bytes", d.gpu_memory_bytes);
  }
  if (d.mem_fraction_static && !(*d.mem_fraction_static > 0.0 && *d.mem_fraction_static < 1.0)) {
    return invalid_argument("mem_fraction_static must be in (0, 1), got {}",
                            *d.mem_fraction_static);
  }
  if (d.page_size < 1) return invalid_argument("page_size must be >= 1, got {}", d.page_size);
  if (d.dcp_size < 1 || d.tp_size % d.dcp_size != 0)
    return invalid_argument("dcp_size {} must be >= 1 and divide tp_size {}", d.dcp_size,
                            d.tp_size);
  if (d.dcp_size > 1 && !spec.is_mla())
    return invalid_argument(
        "dcp_size {}: decode context parallelism shards an MLA latent cache; {} has none",
        d.dcp_size, spec.model_type);
  switch (d.kv_cache_dtype) {
    case DType::kBF16:
    case DType::kFP8E4M3:
    case DType::kFP8E5M2:
    case DType::kF32:
      break;
    default:
      return invalid_argument("unsupported KV cache dtype {}", dtype_name(d.kv_cache_dtype));
  }
  for (int l : d.kv_bf16_layers) {
    if (l < 0 || l >= spec.num_layers) {
      return invalid_argument("bf16 KV layer {} is outside [0, {})", l, spec.num_layers);
    }
  }
  if (spec.num_layers <= 0 || spec.hidden_size <= 0 || spec.vocab_size <= 0) {
    return invalid_argument("model spec has no layers/hidden size/vocab");
  }
  if (spec.num_heads % d.tp_size != 0) {
    return invalid_argument("num_attention_heads {} is not divisible by tp_size {}", spec.num_heads,
                            d.tp_size);
  }
  if (!spec.is_mla() && spec.num_kv_heads > 0 && d.tp_size % spec.num_kv_heads != 0 &&
      spec.num_kv_heads % d.tp_size != 0) {
    return invalid_argument("num_key_value_heads {} and tp_size {}: one must divide the other",
                            spec.num_kv_heads, d.tp_size);
  }
  if (d.max_total_tokens && *d.max_total_tokens <= 0) {
    return invalid_argument("max_total_tokens must be positive");
  }
  if (d.max_running_requests && *d.max_running_requests <= 0) {
    return invalid_argument("max_running_requests must be positive");
  }
  return Status();
}

int64_t rope_cache_positions(const ModelSpec& spec) {
  const RopeSpec& r = spec.rope;
  if (r.type == RopeType::kYarn && r.original_max_position_embeddings > 0) {
    return int64_t(double(r.original_max_position_embeddings) * r.factor);
  }
  return spec.max_position_embeddings;
}

// Load-time allocations beside the checkpoint tensors, per rank (see Plan::explanation).
int64_t estimate_load_overhead(const ModelSpec& spec, const Deployment& d,
                               std::vector<std::string>& why) {
  int64_t total = 0;
  const bool cuda = d.device == PlanDevice::kCuda;
  if (cuda && !d.language_only && spec.model_type != spec.text_model_type) {
    int64_t tower = -1;
    for (const VisionTower& v : kVisionTowers) {
      if (spec.model_type == v.model_type) tower = v.bytes;
    }
    if (tower >= 0) {
      total += tower;
      why.push_back(fmt::format(
          "  + vision tower of {} (loaded by SGLang unless --language-only, replicated): {}",
          spec.model_type, gib(tower)));
    } else {
      why.push_back(
          fmt::format("  + vision tower of {}: size unknown, not counted", spec.model_type));
    }
  }
  if (cuda && spec.is_mla()) {
    // SGLang's DeepseekV2 post_load_weights keeps kv_b_proj and adds bf16 contiguous copies of
    // its two halves (w_kc, w_vc) for the absorbed decode path.
    const MlaSpec& m = spec.mla;
    const int64_t bytes = int64_t(spec.num_layers) * (spec.num_heads / d.tp_size) *
                          (m.qk_nope_head_dim + m.v_head_dim) * m.kv_lora_rank * 2;
    total += bytes;
    why.push_back(
        fmt::format("  + MLA absorbed w_kc/w_vc bf16 copies of kv_b_proj: {}", gib(bytes)));
  }
  const int rotary = spec.rope.rotary_dim > 0
                         ? spec.rope.rotary_dim
                         : (spec.is_mla() ? spec.mla.qk_rope_head_dim : spec.head_dim);
  const int64_t rope = rope_cache_positions(spec) * rotary * 4;
  total += rope;
  why.push_back(fmt::format("  + rope cos/sin cache ({} positions x {} x f32): {}",
                            rope_cache_positions(spec), rotary, gib(rope)));
  return total;
}

// SGLang model_runner: max_num_reqs = clamp(tokens / context_len * 512, 2048, 4096) unless
// --max-running-requests; the scheduler then runs at most min(tokens / 2, max_num_reqs).
void size_requests(const Deployment& d, Plan& p) {
  if (d.max_running_requests) {
    p.req_pool_size = *d.max_running_requests;
  } else {
    const int64_t by_tokens =
        int64_t(double(p.profiled_kv_tokens) * p.dcp_size / double(p.context_length) * 512.0);
    p.req_pool_size = std::min<int64_t>(std::max<int64_t>(by_tokens, 2048), 4096);
  }
  const int64_t wanted = d.max_running_requests ? *d.max_running_requests : p.kv_tokens / 2;
  p.max_running_requests = int(std::max<int64_t>(1, std::min(wanted, p.req_pool_size)));
  if (d.avg_seq_len > 0) {
    p.requests_at_avg_len = std::min<int64_t>(p.kv_tokens / d.avg_seq_len, p.max_running_requests);
  }
  const int64_t max_len = d.max_seq_len > 0 ? d.max_seq_len : p.context_length;
  p.requests_at_max_len = std::min<int64_t>(p.kv_tokens / max_len, p.max_running_requests);
}

void size_host_tier(const Deployment& d, Plan& p) {
  int64_t bytes = d.hicache_bytes;
  if (bytes == 0 && d.hicache_ratio > 0) {
    bytes = int64_t(double(p.kv_pool_bytes) * d.hicache_ratio);
  }
  const int64_t rank_tokens = bytes / p.kv_bytes_per_token / d.page_size * d.page_size;
  p.host_tier_tokens = rank_tokens * d.dcp_size;  // each rank keeps its shard of the same pages
  p.host_tier_bytes = rank_tokens * p.kv_bytes_per_token;
}

// Decode context parallelism's traffic, and the data-parallel-attention alternative.
void size_attention_parallelism(const ModelSpec& spec, const Deployment& d, int64_t kv_budget_bytes,
                                Plan& p) {
  if (!spec.is_mla()) return;
  const MlaSpec& m = spec.mla;
  const int64_t heads = spec.num_heads / d.tp_size, n = d.dcp_size;
  if (n > 1) {
    p.dcp_gather_bytes_per_token_layer =
        (n - 1) * heads * (m.kv_lora_rank + m.qk_rope_head_dim) * 2;
    p.dcp_all_to_all_bytes_per_token_layer = (n - 1) * heads * (m.kv_lora_rank + 1) * 4;
  }
  if (d.tp_size == 1) return;
  // The tp-sharded attention weights (q_b or q_proj, kv_b_proj, o_proj; bf16) a rank holds whole
  // instead of 1/tp of; q_a and kv_a are replicated either way.
  const int64_t h = spec.hidden_size, all_heads = spec.num_heads;
  const int64_t qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
  const int64_t q_in = m.q_lora_rank > 0 ? m.q_lora_rank : h;
  const int64_t per_layer =
      (q_in * all_heads * qk +
       int64_t(m.kv_lora_rank) * all_heads * (m.qk_nope_head_dim + m.v_head_dim) +
       all_heads * m.v_head_dim * h) *
      2;
  p.dp_attention_extra_weight_bytes =
      int64_t(spec.num_layers) * per_layer * (d.tp_size - 1) / d.tp_size;
  const int64_t left = kv_budget_bytes - p.dp_attention_extra_weight_bytes;
  p.dp_attention_kv_tokens_per_rank =
      left > 0 ? left / p.kv_bytes_per_token / d.page_size * d.page_size : 0;
}

void explain(const ModelSpec& spec, const Deployment& d, const Plan& p, const InventorySummary& inv,
             const std::vector<std::string>& overhead_lines, std::vector<std::string>& out) {
  out.push_back(fmt::format(
      "checkpoint: {} (bf16 {}, int4 + scales {}, fp8 + scales {}, f32 {}); TP shards: vocab "
      "and column/row-parallel split, MLA latent projections, router and norms replicated, "
      "each expert split across ranks",
      gib(inv.total_bytes), gib(inv.bf16_bytes), gib(inv.int4_bytes), gib(inv.fp8_bytes),
      gib(inv.f32_bytes)));
  out.push_back(fmt::format("GPU memory per rank: {}", gib(d.gpu_memory_bytes)));
  out.push_back(fmt::format(
      "- runtime reserved before weight load (CUDA context + NCCL/all-reduce buffers): {}",
      gib(p.runtime_reserved_bytes)));
  out.push_back(fmt::format("= available before load (SGLang's total_gpu_memory): {}",
                            gib(p.available_before_load_bytes)));
  out.push_back(fmt::format(
      "x mem_fraction_static {:.3f}{} = static budget (weights + KV): {}", p.mem_fraction_static,
      p.mem_fraction_defaulted ? " (SGLang default for this GPU)" : "", gib(p.static_bytes)));
  out.push_back(fmt::format("- weights per rank (checkpoint tensors, TP {}): {}", d.tp_size,
                            gib(p.weight_bytes_per_rank)));
  out.push_back(fmt::format("- load-time overhead: {}", gib(p.load_overhead_bytes)));
  for (const std::string& line : overhead_lines) out.push_back(line);
  out.push_back(fmt::format(
      "= KV budget {} / {} bytes per token ({} {}, {}) = {} tokens",
      gib(p.static_bytes - p.weight_bytes_per_rank - p.load_overhead_bytes), p.kv_bytes_per_token,
      spec.is_mla() ? "MLA latent" : "K+V", kv_cache_dtype_name(p.kv_cache_dtype),
      spec.is_mla() ? "replicated on every rank" : "per rank", p.profiled_kv_tokens));
  if (d.max_total_tokens && *d.max_total_tokens < p.profiled_kv_tokens) {
    out.push_back(fmt::format("  capped by --max-total-tokens {}", *d.max_total_tokens));
  }
  out.push_back(fmt::format("  rounded down to pages of {}: {} tokens, pool {}", d.page_size,
                            p.kv_tokens_per_rank, gib(p.kv_pool_bytes)));
  if (p.dcp_size > 1) {
    out.push_back(fmt::format(
        "x dcp_size {} (each rank of a group holds 1/{} of every sequence's tokens): {} tokens; "
        "per decoded token "
        "and layer each rank all-gathers {} B of queries and all-to-alls {} B of partials",
        p.dcp_size, p.dcp_size, p.kv_tokens, p.dcp_gather_bytes_per_token_layer,
        p.dcp_all_to_all_bytes_per_token_layer));
  }
  if (spec.is_mla() && d.tp_size > 1) {
    out.push_back(
        fmt::format("data-parallel attention instead (whole attention weights on every rank, each "
                    "rank its own requests): "
                    "+{} of weights per rank, {} tokens per rank x {} ranks = {} tokens{}",
                    gib(p.dp_attention_extra_weight_bytes), p.dp_attention_kv_tokens_per_rank,
                    d.tp_size, p.dp_attention_kv_tokens_per_rank * d.tp_size,
                    p.dp_attention_kv_tokens_per_rank == 0
                        ? " (does not fit: the replicated attention weights leave no KV room)"
                        : fmt::format(" (fits; a request may not outgrow one rank's {} tokens, and "
                                      "ranks balance by requests)",
                                      p.dp_attention_kv_tokens_per_rank)));
  }
  out.push_back(fmt::format(
      "max running requests: min({}, request slots {}) = {} (slots = clamp(tokens / context {} "
      "x 512, 2048, 4096) unless --max-running-requests)",
      d.max_running_requests ? "--max-running-requests" : "tokens / 2", p.req_pool_size,
      p.max_running_requests, p.context_length));
  out.push_back(fmt::format("headroom for activations and CUDA graphs: {}", gib(p.headroom_bytes)));
  if (p.host_tier_tokens > 0) {
    out.push_back(
        fmt::format("host tier: {} tokens ({})", p.host_tier_tokens, gib(p.host_tier_bytes)));
  }
}

}  // namespace

int64_t kv_bytes_per_token(const ModelSpec& spec, int tp, DType kv_dtype,
                           const std::vector<int>& bf16_layers) {
  int64_t per_layer_elems = 0;
  if (spec.is_mla()) {
    per_layer_elems = spec.mla.kv_lora_rank + spec.mla.qk_rope_head_dim;
  } else {
    const int64_t kv_heads_per_rank = std::max(1, spec.num_kv_heads / std::max(1, tp));
    per_layer_elems = 2 * kv_heads_per_rank * spec.head_dim;
  }
  int64_t total = 0;
  for (int l = 0; l < spec.num_layers; ++l) {
    const bool keep_bf16 =
        std::find(bf16_layers.begin(), bf16_layers.end(), l) != bf16_layers.end();
    total += per_layer_elems * (keep_bf16 ? 2 : kv_dtype_bytes(kv_dtype));
  }
  return total;
}

double default_mem_fraction_static(int64_t gpu_memory_bytes, int tp_size, int chunked_prefill_size,
                                   int cuda_graph_max_bs) {
  const double mem_mib = double(gpu_memory_bytes) / kMiB;
  int chunk = 0, graph_bs = 0;
  if (mem_mib < 20 * 1024) {
    chunk = 2048, graph_bs = 8;
  } else if (mem_mib < 35 * 1024) {
    chunk = 2048, graph_bs = tp_size < 4 ? 24 : 80;
  } else if (mem_mib < 60 * 1024) {
    chunk = 4096, graph_bs = tp_size < 4 ? 32 : 160;
  } else if (mem_mib < 160 * 1024) {
    chunk = 8192, graph_bs = tp_size < 4 ? 256 : 512;
  } else {
    chunk = 16384, graph_bs = 512;
  }
  if (chunked_prefill_size > 0) chunk = chunked_prefill_size;
  if (cuda_graph_max_bs > 0) graph_bs = cuda_graph_max_bs;
  double reserved = 512 + std::max(chunk, 2048) * 1.5 + graph_bs * 2 + tp_size / 8.0 * 1024;
  if (mem_mib > 60 * 1024) reserved = std::max(reserved, 10.0 * 1024);
  return std::round((mem_mib - reserved) / mem_mib * 1000.0) / 1000.0;
}

namespace {
// The dtypes a KV pool is planned in, with the checkpoint-style aliases.
constexpr EnumName<DType> kKvCacheDTypeNames[] = {
    {DType::kBF16, "bf16"},  {DType::kFP8E4M3, "fp8_e4m3"}, {DType::kFP8E5M2, "fp8_e5m2"},
    {DType::kF32, "f32"},    {DType::kBF16, "bfloat16"},    {DType::kBF16, "auto"},
    {DType::kF32, "float32"}};
}  // namespace

StatusOr<DType> parse_kv_cache_dtype(std::string_view name) {
  if (std::optional<DType> d = enum_from_name_in(kKvCacheDTypeNames, name)) return *d;
  return invalid_argument("unknown KV cache dtype '{}' (expected {})", name,
                          enum_name_list_in(kKvCacheDTypeNames, ", "));
}

StatusOr<Plan> plan_kv_capacity(const ModelSpec& spec, const Deployment& d) {
  STRATA_RETURN_IF_ERROR(validate(spec, d));
  Plan p;
  p.kv_cache_dtype = d.kv_cache_dtype;
  p.mem_fraction_defaulted = !d.mem_fraction_static.has_value();
  p.mem_fraction_static = d.mem_fraction_static ? *d.mem_fraction_static
                                                : default_mem_fraction_static(
                                                      d.gpu_memory_bytes, d.tp_size,
                                                      d.chunked_prefill_size, d.cuda_graph_max_bs);
  const InventorySummary inv = summarize_inventory(spec, build_inventory(spec), d.tp_size,
                                                   quant_layout(spec), d.weight_policy);
  p.total_params = inv.total_params;
  p.active_params = inv.active_params;
  p.weight_bytes_per_rank = inv.bytes_per_rank;

  std::vector<std::string> overhead_lines;
  p.load_overhead_bytes = estimate_load_overhead(spec, d, overhead_lines);
  if (d.load_overhead_bytes) {
    p.load_overhead_bytes = *d.load_overhead_bytes;
    overhead_lines = {fmt::format("  (given: {})", gib(p.load_overhead_bytes))};
  }
  p.runtime_reserved_bytes = d.runtime_reserved_bytes ? *d.runtime_reserved_bytes
                             : d.device == PlanDevice::kCpu
                                 ? 0
                                 : kCudaContextBytes + (d.tp_size > 1 ? kDistInitBytes : 0);
  p.available_before_load_bytes = d.gpu_memory_bytes - p.runtime_reserved_bytes;
  p.static_bytes = int64_t(p.mem_fraction_static * double(p.available_before_load_bytes));
  p.headroom_bytes = p.available_before_load_bytes - p.static_bytes;
  p.kv_bytes_per_token = kv_bytes_per_token(spec, d.tp_size, d.kv_cache_dtype, d.kv_bf16_layers);
  p.context_length = d.context_length > 0 ? d.context_length : spec.max_position_embeddings;
  if (p.context_length <= 0) return invalid_argument("context length unknown: pass one");

  const int64_t rest = p.static_bytes - p.weight_bytes_per_rank - p.load_overhead_bytes;
  p.profiled_kv_tokens = std::max<int64_t>(0, rest) / p.kv_bytes_per_token;
  int64_t tokens = p.profiled_kv_tokens;
  p.dcp_size = d.dcp_size;
  // --max-total-tokens caps the group's pool; each rank holds 1/dcp_size of it.
  if (d.max_total_tokens) tokens = std::min(tokens, *d.max_total_tokens / d.dcp_size);
  p.kv_tokens_per_rank = tokens / d.page_size * d.page_size;
  p.kv_tokens = p.kv_tokens_per_rank * d.dcp_size;
  if (p.kv_tokens <= 0) {
    const int64_t need = p.weight_bytes_per_rank + p.load_overhead_bytes +
                         int64_t(d.page_size) * p.kv_bytes_per_token;
    const double min_fraction = double(need) / double(p.available_before_load_bytes);
    const std::string hint =
        min_fraction < 1.0
            ? fmt::format("the smallest fraction that fits one page is {:.4f}", min_fraction)
            : fmt::format("it needs {} per rank: more memory or a larger tp_size", gib(need));
    return resource_exhausted(
        "weights ({} per rank) and load overhead ({}) leave no room for the KV cache at "
        "mem_fraction_static {:.3f} of {} available; {}",
        gib(p.weight_bytes_per_rank), gib(p.load_overhead_bytes), p.mem_fraction_static,
        gib(p.available_before_load_bytes), hint);
  }
  p.kv_pool_bytes = p.kv_tokens_per_rank * p.kv_bytes_per_token;
  size_requests(d, p);
  size_host_tier(d, p);
  size_attention_parallelism(spec, d, rest, p);
  explain(spec, d, p, inv, overhead_lines, p.explanation);
  return p;
}

}  // namespace strata
