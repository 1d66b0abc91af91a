// Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2) in the absorbed form, written against the
// Backend ops so that arch/deepseek.cc and tests/unit/arch share one implementation.
//
// Per token the cache holds only [normalized latent c (kv_lora_rank) | roped k_rope (rope dim)].
// Head h's key is [W_UK_h c | k_rope] and its value W_UV_h c, where kv_b_proj stacks, per head,
// W_UK_h [nope, rank] then W_UV_h [v, rank]. Since q_nope · (W_UK_h c) = (W_UK_hᵀ q_nope) · c,
// the query is folded into latent space once and attention runs over the cached rows directly;
// the per-head output (still latent) is expanded by W_UV_h afterwards.
#pragma once

#include "backend/backend.h"
#include "model/spec.h"

namespace strata {

struct MlaDims {
  int num_heads = 0;
  int kv_lora_rank = 0;
  int qk_nope_head_dim = 0;
  int qk_rope_head_dim = 0;
  int v_head_dim = 0;
  int q_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  int cache_dim() const { return kv_lora_rank + qk_rope_head_dim; }
};

MlaDims mla_dims(const ModelSpec& spec);

// kv_b_proj split per head and laid out for Backend::per_head_linear.
struct MlaAbsorbedWeights {
  DeviceTensorPtr w_uk;  // [heads, kv_lora_rank, qk_nope]: W_UK_hᵀ
  DeviceTensorPtr w_uv;  // [heads, v_head_dim, kv_lora_rank]: W_UV_h
};

// kv_b: float32 host [heads · (nope + v), kv_lora_rank] as stored in the checkpoint. Done once at
// load time.
MlaAbsorbedWeights split_kv_b(Backend& be, const Tensor& kv_b, const MlaDims& d);

// The softmax scale of transformers' DeepseekV3Attention: qk_head_dim^-0.5, times
// mscale(factor, mscale_all_dim)² when the rope is scaled and mscale_all_dim is set.
float mla_softmax_scale(const ModelSpec& spec);

// Turns kv_a_proj_with_mqa's output kv_a [T, kv_lora_rank + rope] into cache rows, in place:
// RMSNorm (weight norm [kv_lora_rank], eps) on the latent, rope on the key part.
void mla_make_cache_rows(Backend& be, const MlaDims& d, const Tensor& kv_a, const Tensor& norm,
                         float eps, const int32_t* positions, const RopeArgs& rope);

// Backend::mla_attention_inputs' arguments: the cache row's norm eps, the rope, q's rope offset.
MlaInputsArgs mla_inputs_args(const MlaDims& d, float eps, const RopeArgs& rope);

// The MLA step's attention inputs in one backend op (Backend::mla_attention_inputs, one launch
// on the GPU): mla_make_cache_rows on kv_a, rope on q (applied at the rope offset of each head),
// q's rope dims copied into q_latent [T, heads, kv_lora_rank + rope]'s last columns, and the cache
// rows written into `layer` of kv.
void mla_prepare_attention(Backend& be, const MlaDims& d, const Tensor& kv_a, const Tensor& norm,
                           const MlaInputsArgs& args, const Tensor& q, const Tensor& q_latent,
                           KvStorage& kv, int layer, const AttentionMetadata& meta);

// Absorbed attention of the batch's new tokens. q [T, heads, nope + rope] with rope applied; the
// layer's cache rows of the new tokens already written. out [T, heads, v_head_dim].
void mla_absorbed_attention(Backend& be, const MlaDims& d, const MlaAbsorbedWeights& w, float scale,
                            const Tensor& q, const KvStorage& kv, int layer,
                            const AttentionMetadata& meta, const Tensor& out);
// The same after mla_prepare_attention: q_latent's rope columns already hold q's roped dims (the
// W_UK products fill the rest). The two steps below, in order.
void mla_absorbed_attention_latent(Backend& be, const MlaDims& d, const MlaAbsorbedWeights& w,
                                   float scale, const Tensor& q, const Tensor& q_latent,
                                   const KvStorage& kv, int layer, const AttentionMetadata& meta,
                                   const Tensor& out);
// q_latent's first kv_lora_rank columns of each head = W_UK_hᵀ q_nope (one per-head linear). It
// reads only q's nope columns and writes only those of q_latent, so it may run beside
// mla_prepare_attention (a side branch: backend/side_branch.h).
void mla_absorb_q(Backend& be, const MlaDims& d, const MlaAbsorbedWeights& w, const Tensor& q,
                  const Tensor& q_latent);
// The attention over the latent cache of a complete q_latent, then W_UV per head into out.
void mla_attend_latent(Backend& be, const MlaDims& d, const MlaAbsorbedWeights& w, float scale,
                       const Tensor& q_latent, const KvStorage& kv, int layer,
                       const AttentionMetadata& meta, const Tensor& out);

}  // namespace strata
