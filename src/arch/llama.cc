// The Llama family forward pass: llama, mistral, qwen2 (q/k/v bias), qwen3 (per-head q/k
// RMSNorm). Pre-norm decoder layers: attention (GQA, rope) and a SwiGLU MLP.
#include <cmath>
#include <vector>

#include "arch/model.h"
#include "arch/rope.h"
#include "model/weights.h"

namespace strata {
namespace {

struct LlamaLayer {
  DeviceTensorPtr input_norm;   // [hidden]
  LinearWeight qkv;             // [(heads + 2 kv_heads) · head_dim, hidden]
  DeviceTensorPtr q_norm;       // [head_dim] (qwen3) or null
  DeviceTensorPtr k_norm;       // [head_dim] (qwen3) or null
  LinearWeight o_proj;          // [hidden, heads · head_dim]
  DeviceTensorPtr post_norm;    // [hidden]
  LinearWeight gate_up;         // [2 · intermediate, hidden]
  LinearWeight down;            // [hidden, intermediate]
};

class LlamaModel : public Model {
 public:
  LlamaModel(const ModelSpec& spec, Backend& backend) : Model(spec, backend) {}

  Status load(const WeightStore& ws);

  KvLayout kv_layout() const override {
    KvLayout l;
    l.num_layers = spec_.num_layers;
    l.k_dim = spec_.num_kv_heads * spec_.head_dim;
    l.v_dim = spec_.num_kv_heads * spec_.head_dim;
    return l;
  }

  void forward(const ForwardBatch& batch, KvStorage& kv, float* logits) override;

 private:
  void attention_block(int layer, const Tensor& h, const ForwardBatch& batch, KvStorage& kv,
                       const RopeArgs& rope, const Tensor& out);
  void mlp_block(int layer, const Tensor& h, const Tensor& out);

  DeviceTensorPtr embed_;      // [vocab, hidden]
  DeviceTensorPtr final_norm_; // [hidden]
  LinearWeight lm_head_;       // [vocab, hidden] (the embedding when tied)
  std::vector<LlamaLayer> layers_;
  RopeFrequencies rope_freqs_;
};

Status LlamaModel::load(const WeightStore& ws) {
  const ModelSpec& s = spec_;
  Backend& be = *backend_;
  const std::string& pre = s.weight_prefix;
  const int64_t hidden = s.hidden_size, hd = s.head_dim;
  STRATA_ASSIGN_OR_RETURN(embed_, load_weight(ws, be, pre + "embed_tokens.weight", {s.vocab_size, hidden}));
  STRATA_ASSIGN_OR_RETURN(final_norm_, load_weight(ws, be, pre + "norm.weight", {hidden}));
  const std::string head_name = s.tie_word_embeddings ? pre + "embed_tokens.weight" : s.lm_head_name;
  STRATA_ASSIGN_OR_RETURN(lm_head_.weight, load_weight(ws, be, head_name, {s.vocab_size, hidden}));
  for (int l = 0; l < s.num_layers; ++l) {
    const std::string p = pre + "layers." + std::to_string(l) + ".";
    LlamaLayer L;
    STRATA_ASSIGN_OR_RETURN(L.input_norm, load_weight(ws, be, p + "input_layernorm.weight", {hidden}));
    STRATA_ASSIGN_OR_RETURN(L.post_norm,
                            load_weight(ws, be, p + "post_attention_layernorm.weight", {hidden}));
    STRATA_ASSIGN_OR_RETURN(
        L.qkv, load_fused_linear(ws, be,
                                 {{p + "self_attn.q_proj", s.num_heads * hd},
                                  {p + "self_attn.k_proj", s.num_kv_heads * hd},
                                  {p + "self_attn.v_proj", s.num_kv_heads * hd}},
                                 hidden, s.attention_bias));
    STRATA_ASSIGN_OR_RETURN(L.o_proj, load_fused_linear(ws, be, {{p + "self_attn.o_proj", hidden}},
                                                        s.num_heads * hd, s.attention_out_bias));
    if (s.qk_norm) {
      STRATA_ASSIGN_OR_RETURN(L.q_norm, load_weight(ws, be, p + "self_attn.q_norm.weight", {hd}));
      STRATA_ASSIGN_OR_RETURN(L.k_norm, load_weight(ws, be, p + "self_attn.k_norm.weight", {hd}));
    }
    STRATA_ASSIGN_OR_RETURN(L.gate_up,
                            load_fused_linear(ws, be,
                                              {{p + "mlp.gate_proj", s.intermediate_size},
                                               {p + "mlp.up_proj", s.intermediate_size}},
                                              hidden, s.mlp_bias));
    STRATA_ASSIGN_OR_RETURN(L.down, load_fused_linear(ws, be, {{p + "mlp.down_proj", hidden}},
                                                      s.intermediate_size, s.mlp_bias));
    layers_.push_back(std::move(L));
  }
  rope_freqs_ = compute_rope_frequencies(s.rope, s.max_position_embeddings);
  return Status();
}

void LlamaModel::attention_block(int layer, const Tensor& h, const ForwardBatch& batch,
                                 KvStorage& kv, const RopeArgs& rope, const Tensor& out) {
  Backend& be = *backend_;
  const LlamaLayer& L = layers_[size_t(layer)];
  const int64_t t = batch.attn.num_tokens, hd = spec_.head_dim;
  const int64_t heads = spec_.num_heads, kvh = spec_.num_kv_heads;
  const DType act = be.activation_dtype();
  auto qkv = be.alloc(act, {t, (heads + 2 * kvh) * hd});
  be.linear(h, L.qkv, *qkv);
  auto q = be.alloc(act, {t, heads, hd});
  auto k = be.alloc(act, {t, kvh, hd});
  auto v = be.alloc(act, {t, kvh, hd});
  be.slice_columns(*qkv, 0, heads * hd, *q);
  be.slice_columns(*qkv, heads * hd, (heads + kvh) * hd, *k);
  be.slice_columns(*qkv, (heads + kvh) * hd, (heads + 2 * kvh) * hd, *v);
  if (L.q_norm) {
    be.rms_norm(*q, *L.q_norm, float(spec_.rms_norm_eps), *q);
    be.rms_norm(*k, *L.k_norm, float(spec_.rms_norm_eps), *k);
  }
  be.rope(*q, batch.attn.positions, rope);
  be.rope(*k, batch.attn.positions, rope);
  trace(*q, "q_rope", layer);
  trace(*k, "k_rope", layer);
  be.kv_write(kv, layer, *k, *v, batch.attn);
  auto attn = be.alloc(act, {t, heads, hd});
  AttentionArgs args{.scale = float(1.0 / std::sqrt(double(hd))),
                     .num_heads = int(heads),
                     .num_kv_heads = int(kvh),
                     .head_dim = int(hd),
                     .v_head_dim = int(hd)};
  be.paged_attention(*q, kv, layer, batch.attn, args, *attn);
  trace(*attn, "attn", layer);
  be.linear(attn->view().reshape({t, heads * hd}), L.o_proj, out);
}

void LlamaModel::mlp_block(int layer, const Tensor& h, const Tensor& out) {
  Backend& be = *backend_;
  const LlamaLayer& L = layers_[size_t(layer)];
  const int64_t t = h.dim(0), inter = spec_.intermediate_size;
  auto gu = be.alloc(be.activation_dtype(), {t, 2 * inter});
  be.linear(h, L.gate_up, *gu);
  auto act = be.alloc(be.activation_dtype(), {t, inter});
  be.silu_mul(*gu, *act);
  be.linear(*act, L.down, out);
}

void LlamaModel::forward(const ForwardBatch& batch, KvStorage& kv, float* logits) {
  Backend& be = *backend_;
  const int64_t t = batch.attn.num_tokens, hidden = spec_.hidden_size;
  const float eps = float(spec_.rms_norm_eps);
  const DType act = be.activation_dtype();

  RopeFrequencies dyn;
  const RopeFrequencies* freqs = &rope_freqs_;
  if (spec_.rope.type == RopeType::kDynamic) {
    int64_t max_len = 0;
    for (int s = 0; s < batch.attn.num_seqs; ++s) max_len = std::max<int64_t>(max_len, batch.attn.kv_lens[s]);
    dyn = dynamic_rope_frequencies(spec_.rope, spec_.max_position_embeddings, max_len);
    freqs = &dyn;
  }
  const RopeArgs rope{.inv_freq = freqs->inv_freq.data(),
                      .attention_factor = freqs->attention_factor,
                      .rotary_dim = spec_.rope.rotary_dim,
                      .offset = 0,
                      .interleaved = spec_.rope.interleaved};

  auto residual = be.alloc(act, {t, hidden});
  be.embedding(batch.token_ids, int(t), *embed_, *residual);
  trace(*residual, "embed");
  auto h = be.alloc(act, {t, hidden});
  auto branch = be.alloc(act, {t, hidden});  // output of the last attention/MLP block
  for (int l = 0; l < spec_.num_layers; ++l) {
    const LlamaLayer& L = layers_[size_t(l)];
    if (l == 0) {
      be.rms_norm(*residual, *L.input_norm, eps, *h);
    } else {
      be.add_rms_norm(*branch, *residual, *L.input_norm, eps, *h);
    }
    trace(*h, "attn_norm", l);
    attention_block(l, *h, batch, kv, rope, *branch);
    trace(*branch, "attn_out", l);
    be.add_rms_norm(*branch, *residual, *L.post_norm, eps, *h);
    trace(*h, "mlp_norm", l);
    mlp_block(l, *h, *branch);
    trace(*branch, "mlp_out", l);
  }
  be.add_rms_norm(*branch, *residual, *final_norm_, eps, *h);
  trace(*h, "final_norm");
  const int n = batch.num_logit_rows;
  if (n == 0) return;
  auto rows = be.alloc(act, {n, hidden});
  be.gather_rows(*h, batch.logit_rows, n, *rows);
  auto out = be.alloc(act, {n, spec_.vocab_size});
  be.linear(*rows, lm_head_, *out);
  be.download_f32(*out, logits);
}

}  // namespace

StatusOr<std::unique_ptr<Model>> create_llama_model(const ModelSpec& spec,
                                                    const WeightStore& weights, Backend& backend) {
  auto m = std::make_unique<LlamaModel>(spec, backend);
  STRATA_RETURN_IF_ERROR(m->load(weights));
  return std::unique_ptr<Model>(std::move(m));
}

}  // namespace strata
