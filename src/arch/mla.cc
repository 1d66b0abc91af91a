#include "arch/mla.h"

#include <cmath>

#include "arch/rope.h"
#include "core/check.h"

namespace strata {

MlaDims mla_dims(const ModelSpec& spec) {
  return MlaDims{.num_heads = spec.num_heads,
                 .kv_lora_rank = spec.mla.kv_lora_rank,
                 .qk_nope_head_dim = spec.mla.qk_nope_head_dim,
                 .qk_rope_head_dim = spec.mla.qk_rope_head_dim,
                 .v_head_dim = spec.mla.v_head_dim};
}

MlaAbsorbedWeights split_kv_b(Backend& be, const Tensor& kv_b, const MlaDims& d) {
  const int64_t heads = d.num_heads, rank = d.kv_lora_rank, nope = d.qk_nope_head_dim;
  const int64_t v = d.v_head_dim, per_head = nope + v;
  CHECK_EQ(kv_b.dim(0), heads * per_head);
  CHECK_EQ(kv_b.dim(1), rank);
  HostTensor uk(DType::kF32, {heads, rank, nope});
  HostTensor uv(DType::kF32, {heads, v, rank});
  const float* src = kv_b.ptr<float>();
  for (int64_t h = 0; h < heads; ++h) {
    const float* block = src + h * per_head * rank;  // [nope + v, rank]
    for (int64_t i = 0; i < nope; ++i)
      for (int64_t r = 0; r < rank; ++r) uk.f32()[(h * rank + r) * nope + i] = block[i * rank + r];
    for (int64_t j = 0; j < v; ++j)
      for (int64_t r = 0; r < rank; ++r)
        uv.f32()[(h * v + j) * rank + r] = block[(nope + j) * rank + r];
  }
  MlaAbsorbedWeights w;
  w.w_uk = be.upload(uk.view, be.weight_dtype());
  w.w_uv = be.upload(uv.view, be.weight_dtype());
  return w;
}

float mla_softmax_scale(const ModelSpec& spec) {
  double scale = 1.0 / std::sqrt(double(spec.mla.qk_nope_head_dim + spec.mla.qk_rope_head_dim));
  if (spec.rope.type != RopeType::kDefault && spec.rope.mscale_all_dim != 0) {
    const double m = yarn_get_mscale(spec.rope.factor, spec.rope.mscale_all_dim);
    scale *= m * m;
  }
  return float(scale);
}

void mla_make_cache_rows(Backend& be, const MlaDims& d, const Tensor& kv_a, const Tensor& norm,
                         float eps, const int32_t* positions, const RopeArgs& rope) {
  const int64_t t = kv_a.dim(0), rank = d.kv_lora_rank;
  CHECK_EQ(kv_a.dim(1), d.cache_dim());
  CHECK_EQ(norm.numel(), rank);
  be.rms_norm_columns(kv_a, norm, eps);
  RopeArgs r = rope;
  r.offset = int(rank);
  be.rope(kv_a.reshape({t, 1, d.cache_dim()}), positions, r);
}

MlaInputsArgs mla_inputs_args(const MlaDims& d, float eps, const RopeArgs& rope) {
  return MlaInputsArgs{.eps = eps, .rope = rope, .q_rope_offset = d.qk_nope_head_dim};
}

void mla_prepare_attention(Backend& be, const MlaDims& d, const Tensor& kv_a, const Tensor& norm,
                           const MlaInputsArgs& args, const Tensor& q, const Tensor& q_latent,
                           KvStorage& kv, int layer, const AttentionMetadata& meta) {
  CHECK_EQ(kv_a.dim(1), d.cache_dim());
  CHECK_EQ(norm.numel(), d.kv_lora_rank);
  CHECK_EQ(q.dim(1), d.num_heads);
  CHECK_EQ(q.dim(2), d.q_head_dim());
  CHECK_EQ(args.rope.rotary_dim, d.qk_rope_head_dim);
  CHECK_EQ(args.q_rope_offset, d.qk_nope_head_dim);
  be.mla_attention_inputs(kv_a, norm, q, q_latent, args, kv, layer, meta);
}

void mla_absorbed_attention(Backend& be, const MlaDims& d, const MlaAbsorbedWeights& w, float scale,
                            const Tensor& q, const KvStorage& kv, int layer,
                            const AttentionMetadata& meta, const Tensor& out) {
  auto q_latent = be.alloc(be.activation_dtype(), {q.dim(0), d.num_heads, d.cache_dim()});
  be.copy_columns(q, d.qk_nope_head_dim, d.q_head_dim(), *q_latent, d.kv_lora_rank);
  mla_absorbed_attention_latent(be, d, w, scale, q, *q_latent, kv, layer, meta, out);
}

void mla_absorbed_attention_latent(Backend& be, const MlaDims& d, const MlaAbsorbedWeights& w,
                                   float scale, const Tensor& q, const Tensor& q_latent,
                                   const KvStorage& kv, int layer, const AttentionMetadata& meta,
                                   const Tensor& out) {
  mla_absorb_q(be, d, w, q, q_latent);
  mla_attend_latent(be, d, w, scale, q_latent, kv, layer, meta, out);
}

void mla_absorb_q(Backend& be, const MlaDims& d, const MlaAbsorbedWeights& w, const Tensor& q,
                  const Tensor& q_latent) {
  CHECK_EQ(q.dim(1), d.num_heads);
  CHECK_EQ(q.dim(2), d.q_head_dim());
  CHECK_EQ(q_latent.numel(), q.dim(0) * d.num_heads * d.cache_dim());
  // q_latent[t, h] = [W_UK_hᵀ q_nope | q_rope]: the rope part comes from mla_prepare_attention.
  be.per_head_linear(q, 0, *w.w_uk, q_latent, 0);
}

void mla_attend_latent(Backend& be, const MlaDims& d, const MlaAbsorbedWeights& w, float scale,
                       const Tensor& q_latent, const KvStorage& kv, int layer,
                       const AttentionMetadata& meta, const Tensor& out) {
  const int64_t t = q_latent.dim(0), heads = d.num_heads, rank = d.kv_lora_rank;
  CHECK_EQ(q_latent.numel(), t * heads * d.cache_dim());
  auto latent_out = be.alloc(be.activation_dtype(), {t, heads, rank});
  const MlaArgs args{.scale = scale,
                     .num_heads = int(heads),
                     .kv_lora_rank = int(rank),
                     .rope_dim = d.qk_rope_head_dim};
  be.mla_attention(q_latent, kv, layer, meta, args, *latent_out);
  be.per_head_linear(*latent_out, 0, *w.w_uv, out, 0);
}

}  // namespace strata
