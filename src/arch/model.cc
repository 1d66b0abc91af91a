#include "arch/model.h"

#include <vector>

#include "arch/tp.h"
#include "core/check.h"
#include "model/config.h"
#include "model/weights.h"

namespace strata {

void Model::forward_logits(const ForwardBatch& batch, KvStorage& kv,
                           const LogitsConsumer& consumer) {
  std::vector<float> host(size_t(batch.num_logit_rows) * size_t(spec_.vocab_size));
  forward(batch, kv, host.data());
  if (batch.num_logit_rows == 0) return;
  DeviceTensorPtr logits = backend_->upload(
      Tensor::make(host.data(), DType::kF32, {batch.num_logit_rows, spec_.vocab_size}),
      DType::kF32);
  consumer(*logits);
}

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
    return internal_error("tensor-parallel rank {} of {} without a matching sharding plan",
                          tp.rank(), tp.size());
  if (tp.dcp_active() && !spec.is_mla())
    return invalid_argument(
        "--dcp-size {}: decode context parallelism shards an MLA latent cache; {} has none "
        "(its KV heads are already split by --tp-size)",
        tp.dcp->size(), spec.model_type);
  switch (spec.arch) {
    case ArchKind::kLlama:
      return create_llama_model(spec, weights, backend, tp);
    case ArchKind::kDeepseek:
      return create_deepseek_model(spec, weights, backend, tp);
  }
  return internal_error("unknown architecture");
}

void Model::move_kv_rows(KvStorage& kv, std::span<const int32_t> from,
                         std::span<const int32_t> to) {
  CHECK_EQ(from.size(), to.size());
  if (!from.empty()) backend_->kv_move_rows(kv, from.data(), to.data(), int(from.size()));
}

Status Model::set_capture(const CaptureSpec& spec, int64_t max_tokens) {
  STRATA_RETURN_IF_ERROR(set_capture_spec(spec));
  if (spec.empty()) return Status();
  if (max_tokens <= 0) return invalid_argument("the capture buffer needs a positive token count");
  capture_buf_ = backend_->alloc(backend_->activation_dtype(), {max_tokens, capture_width()});
  capture_max_tokens_ = max_tokens;
  return Status();
}

Status Model::set_capture_spec(const CaptureSpec& spec) {
  std::vector<int> blocks(size_t(spec_.num_layers), -1);
  for (size_t i = 0; i < spec.layers.size(); ++i) {
    const int l = spec.layers[i];
    if (l < 0 || l >= spec_.num_layers)
      return invalid_argument("capture layer {} is out of range: the model has layers 0..{}", l,
                              spec_.num_layers - 1);
    if (blocks[size_t(l)] >= 0) return invalid_argument("capture layer {} is given twice", l);
    blocks[size_t(l)] = int(i);
  }
  capture_ = spec;
  capture_block_ = std::move(blocks);
  capture_buf_.reset();
  capture_max_tokens_ = 0;
  return Status();
}

StatusOr<DeviceTensorPtr> load_weight(const WeightStore& weights, Backend& backend,
                                      const std::string& name, const Shape& shape) {
  STRATA_ASSIGN_OR_RETURN(HostTensor host, weights.load_f32(name, shape));
  return backend.upload(host.view, backend.weight_dtype());
}

StatusOr<LinearWeight> load_fused_linear(const WeightStore& weights, Backend& backend,
                                         const std::vector<LinearPart>& parts, int64_t in_features,
                                         bool with_bias) {
  return load_sharded_linear(weights, backend, TpRank{}, parts, in_features, with_bias);
}

}  // namespace strata
