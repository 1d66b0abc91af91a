#include "arch/model.h"

#include <cstring>

#include "arch/tp.h"
#include "model/config.h"
#include "model/weights.h"

namespace strata {

StatusOr<std::unique_ptr<Model>> load_model(const std::string& dir, Backend& backend) {
  STRATA_ASSIGN_OR_RETURN(ModelSpec spec, load_model_spec(dir));
  STRATA_ASSIGN_OR_RETURN(WeightStore weights, WeightStore::open(dir, spec.quant));
  return create_model(spec, weights, backend);
}

StatusOr<std::unique_ptr<Model>> create_model(const ModelSpec& spec, const WeightStore& weights,
                                              Backend& backend) {
  return create_model(spec, weights, backend, TpRank{});
}

StatusOr<std::unique_ptr<Model>> create_model(const ModelSpec& spec, const WeightStore& weights,
                                              Backend& backend, const TpRank& tp) {
  if (tp.active() && (tp.plan == nullptr || tp.plan->tp() != tp.size()))
    return internal_error("tensor-parallel rank {} of {} without a matching sharding plan", tp.rank(), tp.size());
  switch (spec.arch) {
    case ArchKind::kLlama:
      return create_llama_model(spec, weights, backend, tp);
    case ArchKind::kDeepseek:
      return create_deepseek_model(spec, weights, backend, tp);
  }
  return internal_error("unknown architecture");
}

StatusOr<DeviceTensorPtr> load_weight(const WeightStore& weights, Backend& backend,
                                      const std::string& name, const Shape& shape) {
  STRATA_ASSIGN_OR_RETURN(HostTensor host, weights.load_f32(name, shape));
  return backend.upload(host.view, backend.weight_dtype());
}

StatusOr<LinearWeight> load_fused_linear(const WeightStore& weights, Backend& backend,
                                         const std::vector<LinearPart>& parts, int64_t in_features,
                                         bool with_bias) {
  int64_t total_out = 0;
  for (const auto& p : parts) total_out += p.out_features;
  HostTensor w(DType::kF32, {total_out, in_features});
  HostTensor b(DType::kF32, {total_out});
  int64_t row = 0;
  for (const auto& p : parts) {
    STRATA_ASSIGN_OR_RETURN(HostTensor part,
                            weights.load_f32(p.name + ".weight", {p.out_features, in_features}));
    std::memcpy(w.f32() + row * in_features, part.f32(), size_t(part.numel()) * 4);
    if (with_bias) {
      STRATA_ASSIGN_OR_RETURN(HostTensor bias, weights.load_f32(p.name + ".bias", {p.out_features}));
      std::memcpy(b.f32() + row, bias.f32(), size_t(p.out_features) * 4);
    }
    row += p.out_features;
  }
  LinearWeight lw;
  lw.weight = backend.upload(w.view, backend.weight_dtype());
  if (with_bias) lw.bias = backend.upload(b.view, DType::kF32);
  return lw;
}

}  // namespace strata
