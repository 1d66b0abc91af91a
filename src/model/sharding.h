// Tensor-parallel sharding plan: which slice of every checkpoint weight each of `tp` ranks holds
// (design.md §4), computed from the ModelSpec alone, so the loaders, `strata plan` and the tests
// share one rule.
//
//   column-parallel (rows of [out, in] split): q/k/v_proj, q_b_proj (MLA), kv_b_proj (MLA),
//                                              gate/up_proj (dense MLP, shared and routed experts)
//   row-parallel (columns split):              o_proj, down_proj; their biases live on rank 0
//   vocab-parallel (rows split):               embed_tokens, lm_head
//   replicated:                                every norm, MLA q_a_proj and kv_a_proj_with_mqa
//                                              (the latent KV is replicated), the MoE router
//                                              (gate.weight, e_score_correction_bias)
//
// Experts: every rank holds every routed expert with 1/tp of its intermediate dim (SGLang's
// default TP-MoE), not expert parallelism. Why: each token's work is split evenly whatever the
// router picks (EP's load follows routing imbalance), the router runs replicated so every rank
// makes the same choice, and Backend::moe_experts needs no change (no masking of remote experts).
// The price is smaller expert GEMMs (DeepSeek-V3 at tp 8: 2048 → 256 columns). Expert
// parallelism and DP attention are designed in dist/expert_parallelism.md.
//
// Attention heads: q heads follow their KV head. kv_heads >= tp: each rank gets kv_heads / tp
// KV heads and their query groups. kv_heads < tp (tp a multiple of kv_heads): KV head k is
// replicated on tp / kv_heads consecutive ranks that split its query group — what the planner's
// kv_bytes_per_token assumes (max(1, kv_heads / tp) heads per rank). MLA splits query heads;
// its latent cache is the same on every rank.
//
// Divisibility is checked with errors naming the field; `allow_uneven` instead splits a count
// that does not divide into balanced ranges (sizes differ by one). That keeps the math exact
// and lets the CPU tests shard the 5-head house models; it is not offered to users, since the
// slowest rank sets the pace.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "model/spec.h"

namespace strata {

struct Range {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  bool operator==(const Range&) const = default;
};

// Rank r's part of n items split into tp balanced contiguous ranges (the first n % tp get one
// more).
Range balanced_split(int64_t n, int tp, int r);

struct RankShard {
  int rank = 0;
  Range q_heads;              // attention heads (GQA or MLA)
  Range kv_heads;             // GQA KV heads (one replicated head when kv_heads < tp); MLA: none
  Range intermediate;         // dense MLP
  Range moe_intermediate;     // each routed expert's intermediate dim
  Range shared_intermediate;  // the shared experts' intermediate (n_shared × moe_intermediate)
  Range vocab;                // embedding and lm_head rows
};

enum class ShardKind : uint8_t { kReplicated, kColumn, kRow, kVocab };
inline constexpr EnumName<ShardKind> kShardKindNames[] = {{ShardKind::kReplicated, "replicated"},
                                                          {ShardKind::kColumn, "column-parallel"},
                                                          {ShardKind::kRow, "row-parallel"},
                                                          {ShardKind::kVocab, "vocab-parallel"}};
constexpr const auto& enum_names(ShardKind) { return kShardKindNames; }
inline const char* shard_kind_name(ShardKind kind) { return enum_name(kind).data(); }

// The slice of one checkpoint tensor a rank loads: rows × cols of [out, in], or rows of a 1-D
// tensor (cols then {0, 1}). `empty` for a row-parallel bias on ranks other than 0 (the bias is
// added once, before the all-reduce).
struct WeightShard {
  ShardKind kind = ShardKind::kReplicated;
  Range rows;
  Range cols;
  bool empty = false;
};

struct ShardingOptions {
  bool allow_uneven = false;  // tests only: see the header comment
};

class TpShardPlan {
 public:
  int tp() const { return int(ranks_.size()); }
  const RankShard& rank(int r) const { return ranks_[size_t(r)]; }
  bool kv_heads_replicated() const { return kv_replicated_; }

  // The slice rank `r` holds of checkpoint tensor `name` whose full shape is `shape`. Names are
  // matched on their module suffix (q_proj.weight, mlp.experts.3.down_proj.weight, ...).
  // Errors: a name this plan does not know, or a shape that does not fit the spec.
  StatusOr<WeightShard> shard(int r, std::string_view name, const Shape& shape) const;

 private:
  friend StatusOr<TpShardPlan> plan_tp_sharding(const ModelSpec&, int, const ShardingOptions&);
  ModelSpec spec_;
  bool kv_replicated_ = false;
  std::vector<RankShard> ranks_;  // [tp]
};

// The plan for `tp` ranks. Errors (InvalidArgument) name what does not divide: attention heads,
// KV heads (neither divides the other), intermediate_size, moe_intermediate_size, the shared
// experts' width, vocab_size, INT4 group / FP8 block alignment of the row-parallel slices.
StatusOr<TpShardPlan> plan_tp_sharding(const ModelSpec& spec, int tp,
                                       const ShardingOptions& options = {});

}  // namespace strata
