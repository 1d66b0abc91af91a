#include "model/inventory.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <map>

#include "core/check.h"
#include "model/quant.h"
#include "model/weight_names.h"

namespace strata {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

class Builder {
 public:
  explicit Builder(const ModelSpec& spec) : spec_(spec), names_(spec) {}

  std::vector<WeightEntry> build() {
    add(WeightNames::weight(names_.embed_tokens()), {spec_.vocab_size, spec_.hidden_size},
        Sharding::kVocab, WeightRole::kEmbedding);
    for (int l = 0; l < spec_.num_layers; ++l) {
      layer_ = l;
      norm(WeightNames::weight(names_.input_norm(l)), spec_.hidden_size);
      if (spec_.is_mla()) {
        mla_attention(l);
      } else {
        gqa_attention(l);
      }
      norm(WeightNames::weight(names_.post_norm(l)), spec_.hidden_size);
      if (spec_.is_moe_layer(l)) {
        moe(l);
      } else {
        mlp([&](std::string_view proj) { return names_.mlp(l, proj); }, spec_.intermediate_size,
            WeightRole::kDenseMlp);
      }
    }
    layer_ = -1;
    norm(WeightNames::weight(names_.final_norm()), spec_.hidden_size);
    if (!spec_.tie_word_embeddings) {
      add(WeightNames::weight(names_.lm_head()), {spec_.vocab_size, spec_.hidden_size},
          Sharding::kVocab, WeightRole::kLmHead);
    }
    return std::move(out_);
  }

 private:
  WeightEntry& add(std::string name, std::vector<int64_t> shape, Sharding sharding,
                   WeightRole role) {
    WeightEntry w;
    w.name = std::move(name);
    w.shape = std::move(shape);
    w.dtype = spec_.weight_dtype;
    w.sharding = sharding;
    w.role = role;
    w.layer = layer_;
    w.expert = expert_;
    out_.push_back(std::move(w));
    return out_.back();
  }

  // A linear layer's weight (+ optional bias); quantized when the checkpoint's
  // quantization_config covers the module (honouring its `ignore` list).
  void linear(const std::string& module, int64_t out, int64_t in, Sharding sharding,
              WeightRole role, bool bias = false) {
    WeightEntry& w = add(module + ".weight", {out, in}, sharding, role);
    if (quantized(module)) {
      w.quant = spec_.quant.method;
      w.dtype = spec_.quant.method == QuantMethod::kInt4PackQuantized ? DType::kInt4Packed
                                                                      : DType::kFP8E4M3;
    }
    if (sharding == Sharding::kKvHeads) w.head_dim = spec_.head_dim;
    if (bias) {
      // Column-parallel layers split their bias with the outputs; row-parallel ones add the
      // full bias once after the all-reduce, so it is replicated.
      Sharding bias_sharding = sharding == Sharding::kRow ? Sharding::kReplicated : sharding;
      WeightEntry& b = add(module + ".bias", {out}, bias_sharding, role);
      if (sharding == Sharding::kKvHeads) b.head_dim = spec_.head_dim;
    }
  }

  // Routed experts of one layer take expert 0's decision: matching the `ignore` regexes against
  // every expert costs seconds for Kimi-K2.5 (69K modules), and configs quantize experts alike.
  bool quantized(const std::string& module) {
    if (spec_.quant.method == QuantMethod::kNone) return false;
    if (expert_ <= 0) {
      const bool q = is_quantized_module(spec_.quant, module);
      if (expert_ == 0) expert_decision_[module.substr(module.rfind('.') + 1)] = q;
      return q;
    }
    return expert_decision_.at(module.substr(module.rfind('.') + 1));
  }

  void norm(const std::string& name, int64_t n) {
    add(name, {n}, Sharding::kReplicated, WeightRole::kNorm);
  }

  void gqa_attention(int l) {
    namespace wn = weight_names;
    auto a = [&](std::string_view m) { return names_.attn(l, m); };
    const int64_t q_out = int64_t(spec_.num_heads) * spec_.head_dim;
    const int64_t kv_out = int64_t(spec_.num_kv_heads) * spec_.head_dim;
    const int64_t h = spec_.hidden_size;
    const bool b = spec_.attention_bias;
    linear(a(wn::kQProj), q_out, h, Sharding::kColumn, WeightRole::kAttention, b);
    linear(a(wn::kKProj), kv_out, h, Sharding::kKvHeads, WeightRole::kAttention, b);
    linear(a(wn::kVProj), kv_out, h, Sharding::kKvHeads, WeightRole::kAttention, b);
    linear(a(wn::kOProj), h, q_out, Sharding::kRow, WeightRole::kAttention,
           spec_.attention_out_bias);
    if (spec_.qk_norm) {
      norm(WeightNames::weight(a(wn::kQNorm)), spec_.head_dim);
      norm(WeightNames::weight(a(wn::kKNorm)), spec_.head_dim);
    }
  }

  // MLA: the latent projections (q_a, kv_a) and their norms are small and replicated; the
  // per-head up-projections split by heads; o_proj is row-parallel.
  void mla_attention(int l) {
    namespace wn = weight_names;
    auto a = [&](std::string_view m) { return names_.attn(l, m); };
    const MlaSpec& m = spec_.mla;
    const int64_t heads = spec_.num_heads;
    const int64_t h = spec_.hidden_size;
    const int64_t q_head = m.qk_nope_head_dim + m.qk_rope_head_dim;
    if (m.q_lora_rank > 0) {
      linear(a(wn::kQAProj), m.q_lora_rank, h, Sharding::kReplicated, WeightRole::kAttention);
      norm(WeightNames::weight(a(wn::kQALayerNorm)), m.q_lora_rank);
      linear(a(wn::kQBProj), heads * q_head, m.q_lora_rank, Sharding::kColumn,
             WeightRole::kAttention);
    } else {
      linear(a(wn::kQProj), heads * q_head, h, Sharding::kColumn, WeightRole::kAttention);
    }
    linear(a(wn::kKvAProj), m.kv_lora_rank + m.qk_rope_head_dim, h, Sharding::kReplicated,
           WeightRole::kAttention);
    norm(WeightNames::weight(a(wn::kKvALayerNorm)), m.kv_lora_rank);
    linear(a(wn::kKvBProj), heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank,
           Sharding::kColumn, WeightRole::kAttention);
    linear(a(wn::kOProj), h, heads * m.v_head_dim, Sharding::kRow, WeightRole::kAttention);
  }

  // gate/up/down under module(proj): a dense MLP, one routed expert or the shared experts.
  void mlp(const std::function<std::string(std::string_view)>& module, int64_t inter,
           WeightRole role) {
    namespace wn = weight_names;
    const int64_t h = spec_.hidden_size;
    const bool b = spec_.mlp_bias;
    linear(module(wn::kGateProj), inter, h, Sharding::kColumn, role, b);
    linear(module(wn::kUpProj), inter, h, Sharding::kColumn, role, b);
    linear(module(wn::kDownProj), h, inter, Sharding::kRow, role, b);
  }

  void moe(int l) {
    namespace wn = weight_names;
    const MoeSpec& m = spec_.moe;
    const int64_t h = spec_.hidden_size;
    const std::string router = names_.mlp(l, wn::kRouter);
    add(WeightNames::weight(router), {m.n_routed_experts, h}, Sharding::kReplicated,
        WeightRole::kRouter);
    if (m.topk_method == TopkMethod::kNoauxTc) {
      // Stored in float32 in DeepSeek-V3 / Kimi checkpoints.
      add(router + "." + std::string(wn::kRouterBias), {m.n_routed_experts}, Sharding::kReplicated,
          WeightRole::kRouter)
          .dtype = DType::kF32;
    }
    for (int e = 0; e < m.n_routed_experts; ++e) {
      expert_ = e;
      mlp([&](std::string_view proj) { return names_.expert(l, e, proj); }, m.moe_intermediate_size,
          WeightRole::kRoutedExpert);
    }
    expert_ = -1;
    if (m.n_shared_experts > 0) {
      mlp([&](std::string_view proj) { return names_.shared_expert(l, proj); },
          int64_t(m.moe_intermediate_size) * m.n_shared_experts, WeightRole::kSharedExpert);
    }
  }

  const ModelSpec& spec_;
  const WeightNames names_;
  std::vector<WeightEntry> out_;
  int layer_ = -1;
  int expert_ = -1;
  std::map<std::string, bool> expert_decision_;  // projection -> quantized, for this layer
};

}  // namespace

int64_t WeightEntry::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<WeightEntry> build_inventory(const ModelSpec& spec) { return Builder(spec).build(); }

QuantLayout quant_layout(const ModelSpec& spec) {
  QuantLayout l;
  if (spec.quant.method == QuantMethod::kInt4PackQuantized && spec.quant.group_size > 0)
    l.int4_group_size = spec.quant.group_size;
  if (spec.quant.method == QuantMethod::kFp8Block && spec.quant.weight_block_size.size() == 2) {
    l.fp8_block_out = spec.quant.weight_block_size[0];
    l.fp8_block_in = spec.quant.weight_block_size[1];
  }
  return l;
}

std::vector<int64_t> shard_shape(const WeightEntry& w, int tp) {
  CHECK_MSG(tp >= 1, "tp must be >= 1");
  std::vector<int64_t> s = w.shape;
  if (tp == 1 || s.empty()) return s;
  switch (w.sharding) {
    case Sharding::kReplicated:
      break;
    case Sharding::kColumn:
      s[0] = ceil_div(s[0], tp);
      break;
    case Sharding::kRow:
      CHECK_MSG(s.size() == 2, "row-parallel weight {} must be 2-D", w.name);
      s[1] = ceil_div(s[1], tp);
      break;
    case Sharding::kVocab:
      s[0] = ceil_div(s[0], tp);  // rank 0's part of model/sharding.h's balanced split
      break;
    case Sharding::kKvHeads: {
      CHECK_MSG(w.head_dim > 0, "kv-head weight {} has no head_dim", w.name);
      const int64_t heads = s[0] / w.head_dim;
      // SGLang: with tp >= num_kv_heads each rank holds one head (heads replicated tp/kv times).
      s[0] = std::max<int64_t>(1, ceil_div(heads, tp)) * w.head_dim;
      break;
    }
  }
  return s;
}

int64_t storage_bytes(const WeightEntry& w, const std::vector<int64_t>& shape,
                      const QuantLayout& layout) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  if (w.quant == QuantMethod::kNone || shape.size() != 2) return dtype_bytes_for(w.dtype, n);
  // weight_shape's 8 bytes of an INT4 weight are not counted: loaders do not keep it.
  return linear_weight_bytes(stored_format(w, layout), shape[0], shape[1]);
}

LinearFormat stored_format(const WeightEntry& w, const QuantLayout& layout) {
  switch (w.quant) {
    case QuantMethod::kInt4PackQuantized:
      return LinearFormat{.format = WeightFormat::kInt4Group, .group_size = layout.int4_group_size};
    case QuantMethod::kFp8Block:
      return LinearFormat{.format = WeightFormat::kFp8Block,
                          .block_out = layout.fp8_block_out,
                          .block_in = layout.fp8_block_in};
    case QuantMethod::kNone:
      break;
  }
  return LinearFormat{.format = WeightFormat::kDense, .dense_dtype = w.dtype};
}

int64_t device_bytes(const WeightEntry& w, const std::vector<int64_t>& shape,
                     const QuantLayout& layout, const WeightPolicy& policy) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  if (w.name.ends_with(".bias") || w.name.ends_with("e_score_correction_bias")) return n * 4;
  if (w.quant == QuantMethod::kNone || shape.size() != 2 ||
      w.name.ends_with(std::string(weight_names::kKvBProj) + ".weight"))
    return dtype_bytes_for(policy.dense_dtype, n);
  return linear_device_bytes(policy.device_format(stored_format(w, layout)), shape[0], shape[1]);
}

std::vector<std::string> stored_tensor_names(const WeightEntry& w) {
  const std::string suffix = ".weight";
  const bool is_weight = w.name.size() > suffix.size() && w.name.ends_with(suffix);
  if (w.quant == QuantMethod::kNone || !is_weight) return {w.name};
  const std::string m = w.name.substr(0, w.name.size() - suffix.size());
  if (w.quant == QuantMethod::kInt4PackQuantized) {
    return {m + ".weight_packed", m + ".weight_scale", m + ".weight_shape"};
  }
  return {m + ".weight", m + ".weight_scale_inv"};
}

InventorySummary summarize_inventory(const ModelSpec& spec, const std::vector<WeightEntry>& inv,
                                     int tp, const QuantLayout& layout,
                                     const WeightPolicy& policy) {
  InventorySummary s;
  std::map<int, int64_t> routed_by_layer;
  for (const WeightEntry& w : inv) {
    const int64_t n = w.numel();
    s.total_params += n;
    if (w.role == WeightRole::kRoutedExpert) {
      s.routed_expert_params += n;
      routed_by_layer[w.layer] += n;
    }
    const int64_t bytes = storage_bytes(w, w.shape, layout);
    s.total_bytes += bytes;
    std::vector<int64_t> shard = shard_shape(w, tp);
    if (tp > 1 && w.role == WeightRole::kEmbedding) shard[0] += 1;  // the zero row (arch/tp.h)
    s.bytes_per_rank += device_bytes(w, shard, layout, policy);
    switch (w.dtype) {
      case DType::kBF16:
        s.bf16_bytes += bytes;
        break;
      case DType::kInt4Packed:
        s.int4_bytes += bytes;
        break;
      case DType::kFP8E4M3:
        s.fp8_bytes += bytes;
        break;
      case DType::kF32:
        s.f32_bytes += bytes;
        break;
      default:
        s.other_bytes += bytes;
        break;
    }
  }
  s.active_params = s.total_params - s.routed_expert_params;
  const int64_t n_routed = spec.moe.n_routed_experts;
  for (const auto& [layer, params] : routed_by_layer) {
    // Experts of a layer are equal in size: top-k of them are active per token.
    s.active_params += params / n_routed * spec.moe.num_experts_per_tok;
  }
  return s;
}

}  // namespace strata
