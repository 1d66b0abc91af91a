#include "arch/eagle3.h"

#include <cmath>
#include <cstring>

#include "arch/model.h"
#include "core/check.h"
#include "model/config.h"
#include "model/weights.h"

namespace strata {

StatusOr<std::unique_ptr<Eagle3Drafter>> Eagle3Drafter::load(const std::string& dir,
                                                             Backend& backend,
                                                             const Tensor* target_embedding,
                                                             const std::string& target_dir) {
  STRATA_ASSIGN_OR_RETURN(Eagle3Spec spec, load_eagle3_spec(dir));
  if (spec.layer.rope.type == RopeType::kDynamic)
    return invalid_argument("{}: dynamic NTK rope is not supported in a drafter", dir);
  STRATA_ASSIGN_OR_RETURN(WeightStore ws, WeightStore::open(dir));
  std::unique_ptr<Eagle3Drafter> d(new Eagle3Drafter(std::move(spec), backend));
  STRATA_RETURN_IF_ERROR(d->load_weights(ws, target_embedding, target_dir));
  return d;
}

Status Eagle3Drafter::load_weights(const WeightStore& ws, const Tensor* target_embedding,
                                   const std::string& target_dir) {
  namespace n = eagle3_names;
  const ModelSpec& s = spec_.layer;
  Backend& be = *backend_;
  const int64_t h = s.hidden_size, hd = s.head_dim, vocab = s.vocab_size;
  const int64_t th = spec_.target_hidden_size;

  if (ws.contains(n::kEmbed)) {
    STRATA_ASSIGN_OR_RETURN(own_embed_, load_weight(ws, be, n::kEmbed, {vocab, h}));
  } else if (target_embedding != nullptr) {
    if (target_embedding->rank() != 2 || target_embedding->dim(0) != vocab ||
        target_embedding->dim(1) != h)
      return invalid_argument("{}: the target's embedding table is {}, the drafter needs [{}, {}]",
                              ws.dir(), shape_str(target_embedding->shape), vocab, h);
    embed_ = *target_embedding;
  } else if (!target_dir.empty()) {
    STRATA_ASSIGN_OR_RETURN(ModelSpec target, load_model_spec(target_dir));
    STRATA_ASSIGN_OR_RETURN(WeightStore tw, WeightStore::open(target_dir, target.quant));
    STRATA_ASSIGN_OR_RETURN(
        own_embed_, load_weight(tw, be, target.weight_prefix + "embed_tokens.weight", {vocab, h}));
  } else {
    return invalid_argument(
        "{}: the drafter ships no embed_tokens.weight and no target embeddings were given",
        ws.dir());
  }
  if (own_embed_) embed_ = own_embed_->view();

  STRATA_ASSIGN_OR_RETURN(fc_, load_fused_linear(ws, be, {{n::kFc, h}}, 3 * th, spec_.fc_bias));
  STRATA_ASSIGN_OR_RETURN(hidden_norm_, load_weight(ws, be, n::kHiddenNorm, {h}));
  STRATA_ASSIGN_OR_RETURN(input_norm_, load_weight(ws, be, n::kInputNorm, {h}));
  STRATA_ASSIGN_OR_RETURN(post_norm_, load_weight(ws, be, n::kPostNorm, {h}));
  STRATA_ASSIGN_OR_RETURN(qkv_, load_fused_linear(ws, be,
                                                  {{n::kQProj, s.num_heads * hd},
                                                   {n::kKProj, s.num_kv_heads * hd},
                                                   {n::kVProj, s.num_kv_heads * hd}},
                                                  2 * h, false));
  STRATA_ASSIGN_OR_RETURN(o_proj_,
                          load_fused_linear(ws, be, {{n::kOProj, h}}, s.num_heads * hd, false));
  STRATA_ASSIGN_OR_RETURN(gate_up_, load_fused_linear(ws, be,
                                                      {{n::kGateProj, s.intermediate_size},
                                                       {n::kUpProj, s.intermediate_size}},
                                                      h, false));
  STRATA_ASSIGN_OR_RETURN(
      down_, load_fused_linear(ws, be, {{n::kDownProj, h}}, s.intermediate_size, false));
  STRATA_ASSIGN_OR_RETURN(norm_, load_weight(ws, be, n::kNorm, {h}));
  STRATA_ASSIGN_OR_RETURN(
      lm_head_, load_fused_linear(ws, be, {{n::kLmHead, spec_.draft_vocab_size}}, h, false));

  // d2t: target id = i + d2t[i] (int64 as SpecForge writes it; int32 accepted).
  const int64_t dv = spec_.draft_vocab_size;
  d2t_target_.resize(size_t(dv));
  const TensorInfo* d2t = ws.find(n::kD2t);
  if (d2t == nullptr) {
    if (dv != vocab)
      return invalid_argument("{}: draft_vocab_size {} < vocab_size {} needs a d2t tensor",
                              ws.dir(), dv, vocab);
    for (int64_t i = 0; i < dv; ++i) d2t_target_[size_t(i)] = int32_t(i);
  } else {
    if ((d2t->dtype != DType::kI64 && d2t->dtype != DType::kI32) || d2t->shape != Shape{dv})
      return invalid_argument("{}: d2t must be int64 or int32 [{}], is {} {}", d2t->file, dv,
                              dtype_name(d2t->dtype), shape_str(d2t->shape));
    for (int64_t i = 0; i < dv; ++i) {
      int64_t off = 0;
      if (d2t->dtype == DType::kI64) {
        std::memcpy(&off, d2t->data + i * 8, 8);
      } else {
        int32_t v;
        std::memcpy(&v, d2t->data + i * 4, 4);
        off = v;
      }
      const int64_t target = i + off;
      if (target < 0 || target >= vocab)
        return invalid_argument("{}: d2t[{}] = {} maps to {}, outside the vocabulary of {}",
                                d2t->file, i, off, target, vocab);
      d2t_target_[size_t(i)] = int32_t(target);
    }
  }
  rope_freqs_ = compute_rope_frequencies(s.rope, s.max_position_embeddings);
  return Status();
}

KvLayout Eagle3Drafter::kv_layout() const {
  KvLayout l;
  l.num_layers = 1;
  l.k_dim = spec_.layer.num_kv_heads * spec_.layer.head_dim;
  l.v_dim = l.k_dim;
  return l;
}

void Eagle3Drafter::forward(const Eagle3Batch& batch, KvStorage& kv, const Tensor& hidden_out,
                            float* logits) {
  DeviceTensorPtr out = run(batch, kv, hidden_out, logits != nullptr);
  if (out) backend_->download_f32(*out, logits);
}

DeviceTensorPtr Eagle3Drafter::forward_device_logits(const Eagle3Batch& batch, KvStorage& kv,
                                                     const Tensor& hidden_out) {
  return run(batch, kv, hidden_out, /*logits=*/true);
}

DeviceTensorPtr Eagle3Drafter::run(const Eagle3Batch& batch, KvStorage& kv,
                                   const Tensor& hidden_out, bool logits) {
  Backend& be = *backend_;
  const ModelSpec& s = spec_.layer;
  const int64_t t = batch.attn.num_tokens, h = s.hidden_size, hd = s.head_dim;
  const int64_t heads = s.num_heads, kvh = s.num_kv_heads;
  const float eps = float(s.rms_norm_eps);
  const DType act = be.activation_dtype();
  CHECK_MSG((batch.target_features != nullptr) != (batch.prev_hidden != nullptr),
            "an EAGLE-3 forward reads either the target's features or its own hidden states");
  CHECK_MSG(hidden_out.rank() == 2 && hidden_out.dim(0) == t && hidden_out.dim(1) == h,
            "hidden_out is {}, the batch needs [{}, {}]", shape_str(hidden_out.shape), t, h);
  const Tensor& x = hidden_out;  // the residual stream
  if (batch.target_features != nullptr) {
    be.linear(*batch.target_features, fc_, x);
  } else if (batch.prev_hidden->data != x.data) {
    be.copy_columns(*batch.prev_hidden, 0, h, x, 0);
  }

  // [input_layernorm(embedding) ; hidden_norm(x)]: SpecForge's and SGLang's order.
  auto normed = be.alloc(act, {t, h});
  auto cat = be.alloc(act, {t, 2 * h});
  be.embedding(batch.token_ids, int(t), embed_, *normed);
  be.rms_norm(*normed, *input_norm_, eps, *normed);
  be.copy_columns(*normed, 0, h, *cat, 0);
  be.rms_norm(x, *hidden_norm_, eps, *normed);
  be.copy_columns(*normed, 0, h, *cat, h);

  auto qkv = be.alloc(act, {t, (heads + 2 * kvh) * hd});
  be.linear(*cat, qkv_, *qkv);
  const RopeArgs rope{.inv_freq = rope_freqs_.inv_freq.data(),
                      .attention_factor = rope_freqs_.attention_factor,
                      .rotary_dim = s.rope.rotary_dim,
                      .offset = 0,
                      .interleaved = s.rope.interleaved};
  auto q = be.alloc(act, {t, heads, hd});
  be.qkv_rope_kv_write(*qkv, int(heads), int(kvh), int(hd), rope, kv, 0, batch.attn, *q);
  auto attn = be.alloc(act, {t, heads, hd});
  const AttentionArgs args{.scale = float(1.0 / std::sqrt(double(hd))),
                           .num_heads = int(heads),
                           .num_kv_heads = int(kvh),
                           .head_dim = int(hd),
                           .v_head_dim = int(hd)};
  be.paged_attention(*q, kv, 0, batch.attn, args, *attn);
  auto branch = be.alloc(act, {t, h});
  be.linear(attn->view().reshape({t, heads * hd}), o_proj_, *branch);
  be.add_rms_norm(*branch, x, *post_norm_, eps, *normed);  // x += attention
  auto mlp = be.alloc(act, {t, down_.in_features()});
  be.linear_silu_mul(*normed, gate_up_, *mlp);
  be.linear(*mlp, down_, *branch);
  be.add_rms_norm(*branch, x, *norm_, eps, *normed);  // x += mlp: hidden_out; normed: norm(x)

  const int n = batch.num_logit_rows;
  if (n == 0 || !logits) return nullptr;
  auto rows = be.alloc(act, {n, h});
  be.gather_rows(*normed, batch.logit_rows, n, *rows);
  auto out = be.alloc(act, {n, spec_.draft_vocab_size});
  be.linear(*rows, lm_head_, *out);
  return out;
}

}  // namespace strata
