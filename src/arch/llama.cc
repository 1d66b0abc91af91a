// The Llama family forward pass: llama, mistral, qwen2 (q/k/v bias), qwen3 (per-head q/k
// RMSNorm). Pre-norm decoder layers: attention (GQA, rope) and a SwiGLU MLP.
#include <cmath>
#include <vector>

#include "arch/decoder.h"
#include "model/weight_names.h"
#include "model/weights.h"

namespace strata {
namespace {

struct LlamaLayer {
  DeviceTensorPtr input_norm;  // [hidden]
  LinearWeight qkv;            // [(heads + 2 kv_heads) · head_dim, hidden]
  DeviceTensorPtr q_norm;      // [head_dim] (qwen3) or null
  DeviceTensorPtr k_norm;      // [head_dim] (qwen3) or null
  LinearWeight o_proj;         // [hidden, heads · head_dim]
  DeviceTensorPtr post_norm;   // [hidden]
  LinearWeight gate_up;        // [2 · intermediate, hidden]
  LinearWeight down;           // [hidden, intermediate]
};

class LlamaModel : public DecoderModel {
 public:
  LlamaModel(const ModelSpec& spec, Backend& backend, const TpRank& tp)
      : DecoderModel(spec, backend, spec.rope.rotary_dim) {
    tp_ = tp;
    heads_ = tp.active() ? int(tp.shard().q_heads.size()) : spec.num_heads;
    kv_heads_ = tp.active() ? int(tp.shard().kv_heads.size()) : spec.num_kv_heads;
  }

  Status load(const WeightStore& ws);

  KvLayout kv_layout() const override {
    KvLayout l;
    l.num_layers = spec_.num_layers;
    l.k_dim = kv_heads_ * spec_.head_dim;  // this rank's KV heads
    l.v_dim = kv_heads_ * spec_.head_dim;
    return l;
  }

 private:
  const DeviceTensor& input_norm(int layer) const override {
    return *layers_[size_t(layer)].input_norm;
  }
  const DeviceTensor& post_norm(int layer) const override {
    return *layers_[size_t(layer)].post_norm;
  }
  void attention_block(int layer, const Tensor& h, const ForwardBatch& batch, KvStorage& kv,
                       const RopeArgs& rope, const Tensor& out) override;
  void mlp_block(int layer, const Tensor& h, const Tensor& out) override;

  std::vector<LlamaLayer> layers_;
  int heads_ = 0;     // query heads on this rank (all of them at tp = 1)
  int kv_heads_ = 0;  // KV heads on this rank
};

Status LlamaModel::load(const WeightStore& ws) {
  namespace wn = weight_names;
  const ModelSpec& s = spec_;
  Backend& be = *backend_;
  const WeightNames names(s);
  const int64_t hidden = s.hidden_size, hd = s.head_dim;
  const TpRank& tp = tp_;
  STRATA_RETURN_IF_ERROR(load_embedding_and_head(ws));
  for (int l = 0; l < s.num_layers; ++l) {
    LlamaLayer L;
    STRATA_ASSIGN_OR_RETURN(
        L.input_norm, load_weight(ws, be, WeightNames::weight(names.input_norm(l)), {hidden}));
    STRATA_ASSIGN_OR_RETURN(L.post_norm,
                            load_weight(ws, be, WeightNames::weight(names.post_norm(l)), {hidden}));
    STRATA_ASSIGN_OR_RETURN(L.qkv,
                            load_sharded_linear(ws, be, tp,
                                                {{names.attn(l, wn::kQProj), s.num_heads * hd},
                                                 {names.attn(l, wn::kKProj), s.num_kv_heads * hd},
                                                 {names.attn(l, wn::kVProj), s.num_kv_heads * hd}},
                                                hidden, s.attention_bias));
    STRATA_ASSIGN_OR_RETURN(L.o_proj,
                            load_sharded_linear(ws, be, tp, {{names.attn(l, wn::kOProj), hidden}},
                                                s.num_heads * hd, s.attention_out_bias));
    if (s.qk_norm) {
      STRATA_ASSIGN_OR_RETURN(
          L.q_norm, load_weight(ws, be, WeightNames::weight(names.attn(l, wn::kQNorm)), {hd}));
      STRATA_ASSIGN_OR_RETURN(
          L.k_norm, load_weight(ws, be, WeightNames::weight(names.attn(l, wn::kKNorm)), {hd}));
    }
    STRATA_ASSIGN_OR_RETURN(L.gate_up,
                            load_sharded_linear(ws, be, tp,
                                                {{names.mlp(l, wn::kGateProj), s.intermediate_size},
                                                 {names.mlp(l, wn::kUpProj), s.intermediate_size}},
                                                hidden, s.mlp_bias));
    STRATA_ASSIGN_OR_RETURN(L.down,
                            load_sharded_linear(ws, be, tp, {{names.mlp(l, wn::kDownProj), hidden}},
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
  const int64_t heads = heads_, kvh = kv_heads_;
  const DType act = be.activation_dtype();
  auto qkv = be.alloc(act, {t, (heads + 2 * kvh) * hd});
  be.linear(h, L.qkv, *qkv);
  auto q = be.alloc(act, {t, heads, hd});
  if (!L.q_norm && !tracer_) {
    // Split, rope and KV write as one op (one launch on CUDA); the same values as below.
    be.qkv_rope_kv_write(*qkv, int(heads), int(kvh), int(hd), rope, kv, layer, batch.attn, *q);
  } else {
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
  }
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
  const int64_t t = h.dim(0), inter = L.down.in_features();  // this rank's slice
  auto act = be.alloc(be.activation_dtype(), {t, inter});
  be.linear_silu_mul(h, L.gate_up, *act);  // one launch on CUDA at decode sizes
  be.linear(*act, L.down, out);
}

}  // namespace

StatusOr<std::unique_ptr<Model>> create_llama_model(const ModelSpec& spec,
                                                    const WeightStore& weights, Backend& backend,
                                                    const TpRank& tp) {
  auto m = std::make_unique<LlamaModel>(spec, backend, tp);
  STRATA_RETURN_IF_ERROR(m->load(weights));
  return std::unique_ptr<Model>(std::move(m));
}

}  // namespace strata
