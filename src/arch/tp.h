// A model's tensor-parallel rank: its communicator and its slice of the weights
// (model/sharding.h), plus the loaders the architectures use so that tp = 1 loads exactly as
// before (the whole tensor, no communicator).
#pragma once

#include <string>
#include <vector>

#include "arch/model.h"
#include "backend/comm.h"
#include "model/sharding.h"
#include "model/weights.h"

namespace strata {

struct TpRank {
  Communicator* comm = nullptr;       // null: tp = 1
  const TpShardPlan* plan = nullptr;  // null: tp = 1
  // Decode context parallelism (arch/dcp.h): this rank's DCP group of --dcp-size consecutive
  // ranks (the tp communicator itself when --dcp-size = --tp-size); null: none (--dcp-size 1).
  Communicator* dcp = nullptr;
  bool dcp_active() const { return dcp != nullptr && dcp->size() > 1; }
  // True when the forward must talk to other ranks (tp > 1).
  bool active() const { return comm != nullptr && comm->size() > 1; }
  int rank() const { return comm ? comm->rank() : 0; }
  int size() const { return comm ? comm->size() : 1; }
  const RankShard& shard() const { return plan->rank(rank()); }
};

// This rank's slice of checkpoint tensor `name` (full shape `shape`) as float32: the whole
// tensor when tp is not active; an empty HostTensor (numel 0) for a row-parallel bias off rank 0.
StatusOr<HostTensor> load_shard_f32(const WeightStore& weights, const TpRank& tp,
                                    const std::string& name, const Shape& shape);
// load_weight (arch/model.h) for this rank's slice.
StatusOr<DeviceTensorPtr> load_sharded_weight(const WeightStore& weights, Backend& backend,
                                              const TpRank& tp, const std::string& name,
                                              const Shape& shape);
// This rank's slice of linear weight `name` ("<m>.weight", full shape [out, in]) in its stored
// format (core/weight_format.h): column-parallel layers keep their rows, row-parallel ones their
// columns; fp8/INT4 slices must fall on scale blocks/groups (errors say so).
StatusOr<HostLinearWeight> load_linear_shard(const WeightStore& weights, const TpRank& tp,
                                             const std::string& name, const Shape& shape);
// Parts (full output sizes, `in_features` the full input size) of one fused linear, each this
// rank's slice, stacked along the output rows.
StatusOr<HostLinearWeight> load_fused_linear_shard(const WeightStore& weights, const TpRank& tp,
                                                   const std::vector<LinearPart>& parts,
                                                   int64_t in_features);
// `matrices.size()` fused linears (each as load_fused_linear_shard's parts) stacked along a
// leading dim: a MoE layer's routed experts, this rank's slice of each, read in one pass
// (WeightStore::load_linear_stack). `what` names the stack in errors.
StatusOr<HostLinearWeight> load_stacked_linear_shard(
    const WeightStore& weights, const TpRank& tp,
    const std::vector<std::vector<LinearPart>>& matrices, int64_t in_features,
    const std::string& what);
// load_fused_linear for this rank's slices: parts give full output sizes and `in_features` the
// full input size; column-parallel parts keep their rows, row-parallel ones their columns.
StatusOr<LinearWeight> load_sharded_linear(const WeightStore& weights, Backend& backend,
                                           const TpRank& tp, const std::vector<LinearPart>& parts,
                                           int64_t in_features, bool with_bias);
// The vocab-parallel embedding table: this rank's rows plus one zero row at the end, which
// tokens owned by other ranks look up (so the all-reduce of the rows sums exactly one table row);
// at tp = 1 the whole table. A table stored bf16 / f16 / f32 goes to the backend as stored (no
// float32 copy on the host).
StatusOr<DeviceTensorPtr> load_vocab_parallel_embedding(const WeightStore& weights,
                                                        Backend& backend, const TpRank& tp,
                                                        const std::string& name,
                                                        const Shape& shape);

}  // namespace strata
