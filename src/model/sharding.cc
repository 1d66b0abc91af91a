#include "model/sharding.h"

#include <algorithm>

#include "model/weight_names.h"

namespace strata {
namespace {

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}
bool contains(std::string_view s, std::string_view part) {
  return s.find(part) != std::string_view::npos;
}

// Checks that `what` (a count from config.json) splits over tp ranks.
Status check_divisible(int64_t n, int tp, const char* what, const ShardingOptions& o) {
  if (n % tp == 0) return Status();
  if (o.allow_uneven && n >= tp) return Status();
  return invalid_argument("--tp-size {}: {} {} is not divisible by the tensor-parallel size", tp,
                          what, n);
}

Range scale(Range r, int64_t k) { return Range{r.begin * k, r.end * k}; }

}  // namespace

Range balanced_split(int64_t n, int tp, int r) {
  const int64_t base = n / tp, extra = n % tp;
  const int64_t begin = r * base + std::min<int64_t>(r, extra);
  return Range{begin, begin + base + (r < extra ? 1 : 0)};
}

StatusOr<TpShardPlan> plan_tp_sharding(const ModelSpec& s, int tp, const ShardingOptions& o) {
  if (tp < 1) return invalid_argument("--tp-size must be >= 1, got {}", tp);
  const int64_t heads = s.num_heads, kvh = s.is_mla() ? heads : s.num_kv_heads;
  if (heads < 1 || kvh < 1 || heads % kvh != 0)
    return invalid_argument("num_attention_heads {} is not a multiple of num_key_value_heads {}",
                            heads, kvh);
  TpShardPlan plan;
  plan.spec_ = s;
  // Attention heads.
  int64_t replicas = 1;  // ranks sharing one KV head (GQA with kv_heads < tp)
  if (s.is_mla()) {
    STRATA_RETURN_IF_ERROR(check_divisible(heads, tp, "num_attention_heads", o));
  } else if (kvh >= tp) {
    if (kvh % tp != 0 && !o.allow_uneven)
      return invalid_argument(
          "--tp-size {}: num_key_value_heads {} is not divisible by it (and is not "
          "smaller, where KV heads are replicated)",
          tp, kvh);
  } else {
    if (tp % kvh != 0)
      return invalid_argument(
          "--tp-size {}: num_key_value_heads {} is smaller and does not divide it, so KV "
          "heads cannot be replicated evenly",
          tp, kvh);
    replicas = tp / kvh;
    const int64_t group = heads / kvh;
    if (group % replicas != 0 && !(o.allow_uneven && group >= replicas))
      return invalid_argument("--tp-size {}: num_attention_heads {} is not divisible by it", tp,
                              heads);
    plan.kv_replicated_ = true;
  }
  const bool dense = !s.is_mla() || s.moe.n_routed_experts == 0 ||
                     s.moe.first_k_dense_replace > 0 || s.moe.moe_layer_freq > 1;
  if (dense)
    STRATA_RETURN_IF_ERROR(check_divisible(s.intermediate_size, tp, "intermediate_size", o));
  const int64_t moe_inter = s.moe.moe_intermediate_size;
  const int64_t shared_inter = int64_t(s.moe.n_shared_experts) * moe_inter;
  if (s.moe.n_routed_experts > 0) {
    STRATA_RETURN_IF_ERROR(check_divisible(moe_inter, tp, "moe_intermediate_size", o));
    if (shared_inter > 0)
      STRATA_RETURN_IF_ERROR(
          check_divisible(shared_inter, tp, "n_shared_experts x moe_intermediate_size", o));
  }
  STRATA_RETURN_IF_ERROR(check_divisible(s.vocab_size, tp, "vocab_size", o));
  // Row-parallel slices of quantized weights must keep whole quantization groups / blocks.
  if (!o.allow_uneven && tp > 1) {
    int64_t align = 0;
    const char* unit = "";
    if (s.quant.method == QuantMethod::kInt4PackQuantized && s.quant.group_size > 0) {
      align = std::max<int64_t>(8, s.quant.group_size), unit = "the INT4 group size";
    } else if (s.quant.method == QuantMethod::kFp8Block && s.quant.weight_block_size.size() == 2) {
      align = s.quant.weight_block_size[1], unit = "the FP8 block size";
    }
    if (align > 0 && s.moe.n_routed_experts > 0 && (moe_inter / tp) % align != 0)
      return invalid_argument(
          "--tp-size {}: each rank's moe_intermediate_size slice ({}) is not a multiple of "
          "{} ({})",
          tp, moe_inter / tp, unit, align);
    if (align > 0 && s.quant.method == QuantMethod::kFp8Block && dense &&
        (s.intermediate_size / tp) % align != 0)
      return invalid_argument(
          "--tp-size {}: each rank's intermediate_size slice ({}) is not a multiple of "
          "{} ({})",
          tp, s.intermediate_size / tp, unit, align);
  }
  for (int r = 0; r < tp; ++r) {
    RankShard rs;
    rs.rank = r;
    if (s.is_mla()) {
      rs.q_heads = balanced_split(heads, tp, r);
    } else if (replicas == 1) {
      rs.kv_heads = balanced_split(kvh, tp, r);
      rs.q_heads = scale(rs.kv_heads, heads / kvh);
    } else {
      const int64_t k = r / replicas, group = heads / kvh;
      rs.kv_heads = Range{k, k + 1};
      const Range sub = balanced_split(group, int(replicas), int(r % replicas));
      rs.q_heads = Range{k * group + sub.begin, k * group + sub.end};
    }
    rs.intermediate = balanced_split(s.intermediate_size, tp, r);
    rs.moe_intermediate = balanced_split(moe_inter, tp, r);
    rs.shared_intermediate = balanced_split(shared_inter, tp, r);
    rs.vocab = balanced_split(s.vocab_size, tp, r);
    plan.ranks_.push_back(rs);
  }
  return plan;
}

StatusOr<WeightShard> TpShardPlan::shard(int r, std::string_view name, const Shape& shape) const {
  if (r < 0 || r >= tp()) return invalid_argument("rank {} of a {}-rank plan", r, tp());
  if (shape.empty() || shape.size() > 2)
    return invalid_argument("tensor '{}': cannot shard shape {}", name, shape_str(shape));
  const RankShard& rs = ranks_[size_t(r)];
  const ModelSpec& s = spec_;
  const bool is_bias = ends_with(name, ".bias");
  const Range all_rows{0, shape[0]};
  const Range all_cols{0, shape.size() == 2 ? shape[1] : 1};
  WeightShard w{.kind = ShardKind::kReplicated, .rows = all_rows, .cols = all_cols};
  // Splits dim `dim` of the tensor: `part` of `total` (the plan's full size of that dim).
  auto split = [&](ShardKind kind, int dim, Range part, int64_t total) -> StatusOr<WeightShard> {
    if (dim >= int(shape.size()) || shape[size_t(dim)] != total)
      return invalid_argument(
          "tensor '{}' has shape {}: expected {} along dim {} for tensor-parallel "
          "sharding",
          name, shape_str(shape), total, dim);
    w.kind = kind;
    (dim == 0 ? w.rows : w.cols) = part;
    return w;
  };
  // A row-parallel layer's bias is added once: on rank 0.
  auto row_bias = [&]() -> StatusOr<WeightShard> {
    w.kind = ShardKind::kRow;
    w.empty = r != 0;
    return w;
  };
  const int64_t hd = s.head_dim, qk_head = s.mla.qk_nope_head_dim + s.mla.qk_rope_head_dim;
  const int64_t heads = s.num_heads;
  namespace wn = weight_names;
  // Module names (model/weight_names.h) as they appear inside a tensor's name.
  auto attn = [&](std::string_view m) {
    return contains(name, "self_attn." + std::string(m) + ".");
  };
  auto proj = [&](std::string_view m) { return contains(name, std::string(m) + "."); };
  if (ends_with(name, "embed_tokens.weight") || ends_with(name, "lm_head.weight") ||
      name == s.lm_head_name)
    return split(ShardKind::kVocab, 0, rs.vocab, s.vocab_size);
  if (ends_with(name, "norm.weight") || ends_with(name, "layernorm.bias") || attn(wn::kQAProj) ||
      attn(wn::kKvAProj) || ends_with(name, "mlp." + std::string(wn::kRouter) + ".weight") ||
      ends_with(name, wn::kRouterBias))
    return w;
  if (attn(wn::kQProj)) {
    const int64_t per = s.is_mla() ? qk_head : hd;
    return split(ShardKind::kColumn, 0, scale(rs.q_heads, per), heads * per);
  }
  if (attn(wn::kKProj) || attn(wn::kVProj))
    return split(ShardKind::kColumn, 0, scale(rs.kv_heads, hd), int64_t(s.num_kv_heads) * hd);
  if (attn(wn::kQBProj))
    return split(ShardKind::kColumn, 0, scale(rs.q_heads, qk_head), heads * qk_head);
  if (attn(wn::kKvBProj)) {
    const int64_t per = s.mla.qk_nope_head_dim + s.mla.v_head_dim;
    return split(ShardKind::kColumn, 0, scale(rs.q_heads, per), heads * per);
  }
  if (attn(wn::kOProj)) {
    if (is_bias) return row_bias();
    const int64_t per = s.is_mla() ? s.mla.v_head_dim : hd;
    return split(ShardKind::kRow, 1, scale(rs.q_heads, per), heads * per);
  }
  // MLPs: routed experts, shared experts, dense.
  Range inter = rs.intermediate;
  int64_t inter_total = s.intermediate_size;
  if (contains(name, "mlp.experts.")) {
    inter = rs.moe_intermediate, inter_total = s.moe.moe_intermediate_size;
  } else if (contains(name, "mlp.shared_experts.")) {
    inter = rs.shared_intermediate,
    inter_total = int64_t(s.moe.n_shared_experts) * s.moe.moe_intermediate_size;
  }
  if (proj(wn::kGateProj) || proj(wn::kUpProj))
    return split(ShardKind::kColumn, 0, inter, inter_total);
  if (proj(wn::kDownProj)) {
    if (is_bias) return row_bias();
    return split(ShardKind::kRow, 1, inter, inter_total);
  }
  return not_found("tensor '{}': no tensor-parallel sharding rule for it", name);
}

}  // namespace strata
