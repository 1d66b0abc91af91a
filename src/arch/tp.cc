#include "arch/tp.h"

#include <cstring>

namespace strata {

StatusOr<HostTensor> load_shard_f32(const WeightStore& weights, const TpRank& tp,
                                    const std::string& name, const Shape& shape) {
  if (!tp.active()) return weights.load_f32(name, shape);
  STRATA_ASSIGN_OR_RETURN(WeightShard w, tp.plan->shard(tp.rank(), name, shape));
  if (w.empty) return HostTensor();
  return weights.load_f32_slice(name, shape, w.rows.begin, w.rows.end, w.cols.begin, w.cols.end);
}

StatusOr<DeviceTensorPtr> load_sharded_weight(const WeightStore& weights, Backend& backend,
                                              const TpRank& tp, const std::string& name,
                                              const Shape& shape) {
  if (!tp.active()) return load_weight(weights, backend, name, shape);
  STRATA_ASSIGN_OR_RETURN(HostTensor host, load_shard_f32(weights, tp, name, shape));
  return backend.upload(host.view, backend.weight_dtype());
}

namespace {

// The part of linear weight `name` (full shape `shape`) this rank reads.
StatusOr<LinearRead> linear_shard_read(const TpRank& tp, const std::string& name,
                                       const Shape& shape) {
  LinearRead r = LinearRead::whole(name, shape);
  if (!tp.active()) return r;
  STRATA_ASSIGN_OR_RETURN(WeightShard s, tp.plan->shard(tp.rank(), name, shape));
  r.row_begin = s.rows.begin;
  r.row_end = s.rows.end;
  r.col_begin = s.cols.begin;
  r.col_end = s.cols.end;
  return r;
}

}  // namespace

StatusOr<HostLinearWeight> load_linear_shard(const WeightStore& weights, const TpRank& tp,
                                             const std::string& name, const Shape& shape) {
  STRATA_ASSIGN_OR_RETURN(LinearRead r, linear_shard_read(tp, name, shape));
  return weights.load_linear_stack({{r}}, name);
}

StatusOr<HostLinearWeight> load_stacked_linear_shard(
    const WeightStore& weights, const TpRank& tp,
    const std::vector<std::vector<LinearPart>>& matrices, int64_t in_features,
    const std::string& what) {
  std::vector<std::vector<LinearRead>> reads(matrices.size());
  for (size_t m = 0; m < matrices.size(); ++m)
    for (const LinearPart& p : matrices[m]) {
      STRATA_ASSIGN_OR_RETURN(
          LinearRead r, linear_shard_read(tp, p.name + ".weight", {p.out_features, in_features}));
      reads[m].push_back(std::move(r));
    }
  return weights.load_linear_stack(reads, what);
}

StatusOr<HostLinearWeight> load_fused_linear_shard(const WeightStore& weights, const TpRank& tp,
                                                   const std::vector<LinearPart>& parts,
                                                   int64_t in_features) {
  return load_stacked_linear_shard(weights, tp, {parts}, in_features, parts.front().name);
}

StatusOr<LinearWeight> load_sharded_linear(const WeightStore& weights, Backend& backend,
                                           const TpRank& tp, const std::vector<LinearPart>& parts,
                                           int64_t in_features, bool with_bias) {
  STRATA_ASSIGN_OR_RETURN(HostLinearWeight w,
                          load_fused_linear_shard(weights, tp, parts, in_features));
  HostTensor bias;
  if (with_bias) {
    std::vector<HostTensor> bs;
    bool has_bias = false;
    int64_t rows = 0;
    for (const auto& p : parts) {
      STRATA_ASSIGN_OR_RETURN(HostTensor b,
                              load_shard_f32(weights, tp, p.name + ".bias", {p.out_features}));
      has_bias |= b.numel() > 0;
      rows += b.numel();
      bs.push_back(std::move(b));
    }
    // A row-parallel bias is added on rank 0 only (load_shard_f32 gives the others nothing).
    if (has_bias) {
      CHECK_MSG(rows == w.out, "{}: bias slices hold {} values for {} output rows",
                parts.front().name, rows, w.out);
      bias = HostTensor::zeros_f32({w.out});
      int64_t row = 0;
      for (const HostTensor& b : bs) {
        std::memcpy(bias.f32() + row, b.f32(), size_t(b.numel()) * sizeof(float));
        row += b.numel();
      }
    }
  }
  return backend.upload_linear(w, bias.view);
}

StatusOr<DeviceTensorPtr> load_vocab_parallel_embedding(const WeightStore& weights,
                                                        Backend& backend, const TpRank& tp,
                                                        const std::string& name,
                                                        const Shape& shape) {
  const TensorInfo* t = weights.find(name);
  const bool plain = t != nullptr && (t->dtype == DType::kBF16 || t->dtype == DType::kF16 ||
                                      t->dtype == DType::kF32);
  if (!plain) {  // quantized or missing: through float32 (and load_f32's errors)
    if (!tp.active()) return load_weight(weights, backend, name, shape);
    STRATA_ASSIGN_OR_RETURN(HostTensor part, load_shard_f32(weights, tp, name, shape));
    const int64_t rows = part.view.dim(0), hidden = part.view.dim(1);
    HostTensor table = HostTensor::zeros_f32({rows + 1, hidden});
    std::memcpy(table.f32(), part.f32(), size_t(part.numel()) * sizeof(float));
    return backend.upload(table.view, backend.weight_dtype());
  }
  // As stored (a 2 GB bf16 table is not widened to 4 GB of float32 on the host): this rank's rows,
  // read like a linear weight's, plus the zero row under tensor parallelism.
  if (shape.size() != 2)
    return invalid_argument("{}: embedding '{}' must be 2-D, expected {}", weights.dir(), name,
                            shape_str(shape));
  STRATA_ASSIGN_OR_RETURN(LinearRead r, linear_shard_read(tp, name, shape));
  STRATA_ASSIGN_OR_RETURN(HostLinearWeight w, weights.load_linear_stack({{r}}, name));
  const int64_t rows = w.out + (tp.active() ? 1 : 0);
  w.values.resize(size_t(dtype_bytes_for(t->dtype, rows * w.in)));  // the new row is zeros
  return backend.upload(Tensor::make(w.values.data(), t->dtype, {rows, w.in}),
                        backend.weight_dtype());
}

}  // namespace strata
