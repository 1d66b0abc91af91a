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

StatusOr<LinearWeight> load_sharded_linear(const WeightStore& weights, Backend& backend,
                                           const TpRank& tp, const std::vector<LinearPart>& parts,
                                           int64_t in_features, bool with_bias) {
  if (!tp.active()) return load_fused_linear(weights, backend, parts, in_features, with_bias);
  std::vector<HostTensor> ws, bs;
  int64_t out = 0, in = -1;
  bool has_bias = false;
  for (const auto& p : parts) {
    STRATA_ASSIGN_OR_RETURN(HostTensor w, load_shard_f32(weights, tp, p.name + ".weight",
                                                         {p.out_features, in_features}));
    CHECK_MSG(in < 0 || in == w.view.dim(1), "{}: parts of one fused linear shard differently", p.name);
    in = w.view.dim(1);
    out += w.view.dim(0);
    if (with_bias) {
      STRATA_ASSIGN_OR_RETURN(HostTensor b, load_shard_f32(weights, tp, p.name + ".bias", {p.out_features}));
      has_bias = b.numel() > 0;
      if (!has_bias) b = HostTensor::zeros_f32({w.view.dim(0)});
      bs.push_back(std::move(b));
    }
    ws.push_back(std::move(w));
  }
  HostTensor w(DType::kF32, {out, in});
  HostTensor b(DType::kF32, {out});
  int64_t row = 0;
  for (size_t i = 0; i < ws.size(); ++i) {
    std::memcpy(w.f32() + row * in, ws[i].f32(), size_t(ws[i].numel()) * sizeof(float));
    if (with_bias) std::memcpy(b.f32() + row, bs[i].f32(), size_t(bs[i].numel()) * sizeof(float));
    row += ws[i].view.dim(0);
  }
  LinearWeight lw;
  lw.weight = backend.upload(w.view, backend.weight_dtype());
  // A row-parallel bias is added on rank 0 only (has_bias false elsewhere).
  if (has_bias) lw.bias = backend.upload(b.view, DType::kF32);
  return lw;
}

StatusOr<DeviceTensorPtr> load_vocab_parallel_embedding(const WeightStore& weights, Backend& backend,
                                                        const TpRank& tp, const std::string& name,
                                                        const Shape& shape) {
  if (!tp.active()) return load_weight(weights, backend, name, shape);
  STRATA_ASSIGN_OR_RETURN(HostTensor part, load_shard_f32(weights, tp, name, shape));
  const int64_t rows = part.view.dim(0), hidden = part.view.dim(1);
  HostTensor table = HostTensor::zeros_f32({rows + 1, hidden});
  std::memcpy(table.f32(), part.f32(), size_t(part.numel()) * sizeof(float));
  return backend.upload(table.view, backend.weight_dtype());
}

}  // namespace strata
