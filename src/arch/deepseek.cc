// The DeepSeek family forward pass: deepseek_v2, deepseek_v3, kimi_k2, kimi_k25 (text model).
// Pre-norm decoder layers: MLA attention in the absorbed form (arch/mla.h) over a cache of
// [latent | rope key] rows, then a dense SwiGLU MLP (layers < first_k_dense_replace) or a MoE
// block (routed experts through Backend::moe_route / moe_experts plus shared experts).
// Semantics follow transformers' modeling_deepseek_v3 (v2 routing where the config asks for it).
#include <algorithm>
#include <cstring>
#include <vector>

#include "arch/decoder.h"
#include "arch/mla.h"
#include "model/weights.h"

namespace strata {
namespace {

// transformers builds q_a_layernorm and kv_a_layernorm with the RMSNorm default eps, not
// config.rms_norm_eps.
constexpr float kLoraNormEps = 1e-6f;

struct SwiGlu {
  LinearWeight gate_up;  // [2 · inter, hidden]
  LinearWeight down;     // [hidden, inter]
};

struct MoeBlock {
  LinearWeight gate;                // [n_routed_experts, hidden] (router)
  DeviceTensorPtr correction_bias;  // [n_routed_experts] (noaux_tc) or null
  MoeExpertWeights experts;         // stacked routed experts
  bool has_shared = false;
  SwiGlu shared;                    // n_shared_experts × moe_intermediate_size as one MLP
};

struct DeepseekLayer {
  DeviceTensorPtr input_norm;  // [hidden]
  LinearWeight q_proj;         // [heads · qk_head, hidden] (no q_lora)
  LinearWeight q_a;            // [q_lora_rank, hidden]
  DeviceTensorPtr q_a_norm;    // [q_lora_rank]
  LinearWeight q_b;            // [heads · qk_head, q_lora_rank]
  LinearWeight kv_a;           // [kv_lora_rank + rope, hidden]
  DeviceTensorPtr kv_a_norm;   // [kv_lora_rank]
  MlaAbsorbedWeights absorbed; // W_UK / W_UV from kv_b_proj
  LinearWeight o_proj;         // [hidden, heads · v_head_dim]
  DeviceTensorPtr post_norm;   // [hidden]
  bool is_moe = false;
  SwiGlu mlp;                  // dense layers
  MoeBlock moe;                // MoE layers
};

class DeepseekModel : public DecoderModel {
 public:
  DeepseekModel(const ModelSpec& spec, Backend& backend, const TpRank& tp)
      : DecoderModel(spec, backend, mla_dims(spec).qk_rope_head_dim), dims_(mla_dims(spec)) {
    tp_ = tp;
    if (tp.active()) dims_.num_heads = int(tp.shard().q_heads.size());  // this rank's heads
  }

  Status load(const WeightStore& ws);

  KvLayout kv_layout() const override {
    KvLayout l;
    l.num_layers = spec_.num_layers;
    l.k_dim = dims_.cache_dim();
    l.v_dim = 0;
    return l;
  }

 private:
  const DeviceTensor& input_norm(int layer) const override { return *layers_[size_t(layer)].input_norm; }
  const DeviceTensor& post_norm(int layer) const override { return *layers_[size_t(layer)].post_norm; }
  Status load_attention(const WeightStore& ws, const std::string& p, DeepseekLayer& L);
  StatusOr<SwiGlu> load_swiglu(const WeightStore& ws, const std::string& p, int64_t inter);
  Status load_moe(const WeightStore& ws, const std::string& p, MoeBlock& m);

  void attention_block(int layer, const Tensor& h, const ForwardBatch& batch, KvStorage& kv,
                       const RopeArgs& rope, const Tensor& out) override;
  // Dense layers run a SwiGLU MLP, MoE layers the routed experts (+ shared experts).
  void mlp_block(int layer, const Tensor& h, const Tensor& out) override {
    const DeepseekLayer& L = layers_[size_t(layer)];
    if (L.is_moe) {
      moe_block(layer, h, out);
    } else {
      swiglu(L.mlp, h, out);
    }
  }
  void swiglu(const SwiGlu& w, const Tensor& h, const Tensor& out);
  void moe_block(int layer, const Tensor& h, const Tensor& out);

  MlaDims dims_;  // num_heads: this rank's query heads
  float softmax_scale_ = 1.0f;
  MoeRouteArgs route_args_;
  std::vector<DeepseekLayer> layers_;
};

// Routing as the config says (model/config.cc defaults V3-family configs to sigmoid + noaux_tc,
// which transformers 5.17's DeepseekV3TopkRouter hard-codes). transformers' DeepseekV2TopkRouter
// never renormalizes the chosen weights, whatever norm_topk_prob says; follow it.
MoeRouteArgs route_args_from(const ModelSpec& spec) {
  const MoeSpec& m = spec.moe;
  MoeRouteArgs a{.num_experts = m.n_routed_experts,
                 .top_k = m.num_experts_per_tok,
                 .num_groups = m.n_group,
                 .topk_groups = m.topk_group,
                 .scoring = m.scoring_func == ScoringFunc::kSigmoid ? MoeScoring::kSigmoid
                                                                    : MoeScoring::kSoftmax,
                 .group_score = m.topk_method == TopkMethod::kNoauxTc ? MoeGroupScore::kTop2Sum
                                                                      : MoeGroupScore::kMax,
                 .normalize = m.norm_topk_prob && spec.text_model_type != "deepseek_v2",
                 .scaling_factor = float(m.routed_scaling_factor)};
  if (m.topk_method == TopkMethod::kGreedy) a.num_groups = a.topk_groups = 1;
  return a;
}

Status DeepseekModel::load_attention(const WeightStore& ws, const std::string& p,
                                     DeepseekLayer& L) {
  const ModelSpec& s = spec_;
  Backend& be = *backend_;
  const TpRank& tp = tp_;
  const int64_t hidden = s.hidden_size, heads = s.num_heads;  // full sizes: the loaders shard
  const int64_t q_out = heads * dims_.q_head_dim();
  const bool bias = s.attention_bias;
  if (s.mla.q_lora_rank > 0) {
    const int64_t qr = s.mla.q_lora_rank;
    STRATA_ASSIGN_OR_RETURN(L.q_a, load_fused_linear(ws, be, {{p + "q_a_proj", qr}}, hidden, bias));
    STRATA_ASSIGN_OR_RETURN(L.q_a_norm, load_weight(ws, be, p + "q_a_layernorm.weight", {qr}));
    STRATA_ASSIGN_OR_RETURN(L.q_b, load_sharded_linear(ws, be, tp, {{p + "q_b_proj", q_out}}, qr, false));
  } else {
    STRATA_ASSIGN_OR_RETURN(L.q_proj,
                            load_sharded_linear(ws, be, tp, {{p + "q_proj", q_out}}, hidden, false));
  }
  STRATA_ASSIGN_OR_RETURN(
      L.kv_a, load_fused_linear(ws, be, {{p + "kv_a_proj_with_mqa", dims_.cache_dim()}}, hidden, bias));
  STRATA_ASSIGN_OR_RETURN(L.kv_a_norm,
                          load_weight(ws, be, p + "kv_a_layernorm.weight", {dims_.kv_lora_rank}));
  const int64_t kv_b_rows = heads * (dims_.qk_nope_head_dim + dims_.v_head_dim);
  STRATA_ASSIGN_OR_RETURN(HostTensor kv_b, load_shard_f32(ws, tp, p + "kv_b_proj.weight",
                                                           {kv_b_rows, dims_.kv_lora_rank}));
  L.absorbed = split_kv_b(be, kv_b.view, dims_);
  STRATA_ASSIGN_OR_RETURN(L.o_proj, load_sharded_linear(ws, be, tp, {{p + "o_proj", hidden}},
                                                      heads * dims_.v_head_dim, bias));
  return Status();
}

StatusOr<SwiGlu> DeepseekModel::load_swiglu(const WeightStore& ws, const std::string& p,
                                            int64_t inter) {
  SwiGlu m;
  const int64_t hidden = spec_.hidden_size;
  STRATA_ASSIGN_OR_RETURN(
      m.gate_up, load_sharded_linear(ws, *backend_, tp_, {{p + "gate_proj", inter}, {p + "up_proj", inter}},
                                     hidden, false));
  STRATA_ASSIGN_OR_RETURN(m.down,
                          load_sharded_linear(ws, *backend_, tp_, {{p + "down_proj", hidden}}, inter, false));
  return m;
}

Status DeepseekModel::load_moe(const WeightStore& ws, const std::string& p, MoeBlock& m) {
  const MoeSpec& ms = spec_.moe;
  Backend& be = *backend_;
  const int64_t hidden = spec_.hidden_size, full_inter = ms.moe_intermediate_size;
  // Every rank holds every expert, with its slice of the intermediate dim (model/sharding.h).
  const int64_t inter = tp_.active() ? tp_.shard().moe_intermediate.size() : full_inter;
  const int64_t n = ms.n_routed_experts;
  STRATA_ASSIGN_OR_RETURN(m.gate.weight, load_weight(ws, be, p + "gate.weight", {n, hidden}));
  const std::string bias_name = p + "gate.e_score_correction_bias";
  if (ms.topk_method == TopkMethod::kNoauxTc || ws.contains(bias_name)) {
    STRATA_ASSIGN_OR_RETURN(HostTensor bias, ws.load_f32(bias_name, {n}));
    m.correction_bias = be.upload(bias.view, DType::kF32);
  }
  // Stack the routed experts: [n, 2 · inter, hidden] and [n, hidden, inter].
  HostTensor gate_up(DType::kF32, {n, 2 * inter, hidden});
  HostTensor down(DType::kF32, {n, hidden, inter});
  const size_t block = size_t(inter * hidden);
  for (int64_t e = 0; e < n; ++e) {
    const std::string ep = p + "experts." + std::to_string(e) + ".";
    STRATA_ASSIGN_OR_RETURN(HostTensor g, load_shard_f32(ws, tp_, ep + "gate_proj.weight", {full_inter, hidden}));
    STRATA_ASSIGN_OR_RETURN(HostTensor u, load_shard_f32(ws, tp_, ep + "up_proj.weight", {full_inter, hidden}));
    STRATA_ASSIGN_OR_RETURN(HostTensor d, load_shard_f32(ws, tp_, ep + "down_proj.weight", {hidden, full_inter}));
    std::memcpy(gate_up.f32() + size_t(e) * 2 * block, g.f32(), block * sizeof(float));
    std::memcpy(gate_up.f32() + size_t(e) * 2 * block + block, u.f32(), block * sizeof(float));
    std::memcpy(down.f32() + size_t(e) * block, d.f32(), block * sizeof(float));
  }
  m.experts.gate_up = be.upload(gate_up.view, be.weight_dtype());
  m.experts.down = be.upload(down.view, be.weight_dtype());
  if (ms.n_shared_experts > 0) {
    m.has_shared = true;
    STRATA_ASSIGN_OR_RETURN(m.shared, load_swiglu(ws, p + "shared_experts.",
                                                  int64_t(ms.n_shared_experts) * full_inter));
  }
  return Status();
}

Status DeepseekModel::load(const WeightStore& ws) {
  const ModelSpec& s = spec_;
  Backend& be = *backend_;
  const std::string& pre = s.weight_prefix;
  const int64_t hidden = s.hidden_size;
  if (s.mla.kv_lora_rank <= 0 || s.mla.qk_rope_head_dim <= 0 || s.mla.v_head_dim <= 0)
    return invalid_argument("{}: MLA needs kv_lora_rank, qk_rope_head_dim and v_head_dim", ws.dir());
  STRATA_ASSIGN_OR_RETURN(embed_, load_vocab_parallel_embedding(ws, be, tp_, pre + "embed_tokens.weight",
                                                                {s.vocab_size, hidden}));
  STRATA_ASSIGN_OR_RETURN(final_norm_, load_weight(ws, be, pre + "norm.weight", {hidden}));
  const std::string head_name = s.tie_word_embeddings ? pre + "embed_tokens.weight" : s.lm_head_name;
  STRATA_ASSIGN_OR_RETURN(lm_head_.weight, load_sharded_weight(ws, be, tp_, head_name, {s.vocab_size, hidden}));
  for (int l = 0; l < s.num_layers; ++l) {
    const std::string p = pre + "layers." + std::to_string(l) + ".";
    DeepseekLayer L;
    STRATA_ASSIGN_OR_RETURN(L.input_norm, load_weight(ws, be, p + "input_layernorm.weight", {hidden}));
    STRATA_ASSIGN_OR_RETURN(L.post_norm,
                            load_weight(ws, be, p + "post_attention_layernorm.weight", {hidden}));
    STRATA_RETURN_IF_ERROR(load_attention(ws, p + "self_attn.", L));
    L.is_moe = s.is_moe_layer(l);
    if (L.is_moe) {
      STRATA_RETURN_IF_ERROR(load_moe(ws, p + "mlp.", L.moe));
    } else {
      STRATA_ASSIGN_OR_RETURN(L.mlp, load_swiglu(ws, p + "mlp.", s.intermediate_size));
    }
    layers_.push_back(std::move(L));
  }
  rope_freqs_ = compute_rope_frequencies(s.rope, s.max_position_embeddings);
  softmax_scale_ = mla_softmax_scale(s);
  if (s.moe.n_routed_experts > 0) route_args_ = route_args_from(s);
  return Status();
}

void DeepseekModel::attention_block(int layer, const Tensor& h, const ForwardBatch& batch,
                                    KvStorage& kv, const RopeArgs& rope, const Tensor& out) {
  Backend& be = *backend_;
  const DeepseekLayer& L = layers_[size_t(layer)];
  const int64_t t = batch.attn.num_tokens, heads = dims_.num_heads;
  const DType act = be.activation_dtype();
  auto q = be.alloc(act, {t, heads, dims_.q_head_dim()});
  if (L.q_a.weight) {
    auto qa = be.alloc(act, {t, spec_.mla.q_lora_rank});
    be.linear(h, L.q_a, *qa);
    be.rms_norm(*qa, *L.q_a_norm, kLoraNormEps, *qa);
    trace(*qa, "q_a_norm", layer);
    be.linear(*qa, L.q_b, *q);
  } else {
    be.linear(h, L.q_proj, *q);
  }
  RopeArgs q_rope = rope;
  q_rope.offset = dims_.qk_nope_head_dim;
  be.rope(*q, batch.attn.positions, q_rope);
  trace(*q, "q_rope", layer);

  auto kv_row = be.alloc(act, {t, dims_.cache_dim()});
  be.linear(h, L.kv_a, *kv_row);
  mla_make_cache_rows(be, dims_, *kv_row, *L.kv_a_norm, kLoraNormEps, batch.attn.positions, rope);
  trace(*kv_row, "kv_cache_row", layer);
  be.kv_write(kv, layer, *kv_row, Tensor{}, batch.attn);

  auto attn = be.alloc(act, {t, heads, dims_.v_head_dim});
  mla_absorbed_attention(be, dims_, L.absorbed, softmax_scale_, *q, kv, layer, batch.attn, *attn);
  trace(*attn, "attn", layer);
  be.linear(attn->view().reshape({t, heads * dims_.v_head_dim}), L.o_proj, out);
}

void DeepseekModel::swiglu(const SwiGlu& w, const Tensor& h, const Tensor& out) {
  Backend& be = *backend_;
  const int64_t t = h.dim(0), inter = w.down.in_features();
  auto gu = be.alloc(be.activation_dtype(), {t, 2 * inter});
  be.linear(h, w.gate_up, *gu);
  auto act = be.alloc(be.activation_dtype(), {t, inter});
  be.silu_mul(*gu, *act);
  be.linear(*act, w.down, out);
}

void DeepseekModel::moe_block(int layer, const Tensor& h, const Tensor& out) {
  Backend& be = *backend_;
  const MoeBlock& m = layers_[size_t(layer)].moe;
  const int64_t t = h.dim(0), k = route_args_.top_k;
  auto logits = be.alloc(DType::kF32, {t, route_args_.num_experts});
  be.linear(h, m.gate, *logits);
  trace(*logits, "router_logits", layer);
  auto ids = be.alloc(DType::kI32, {t, k});
  auto weights = be.alloc(DType::kF32, {t, k});
  be.moe_route(*logits, m.correction_bias ? m.correction_bias->view() : Tensor{}, route_args_, *ids,
               *weights);
  trace(*weights, "topk_weights", layer);
  be.moe_experts(h, m.experts, *ids, *weights, out);
  trace(out, "routed_out", layer);
  if (m.has_shared) {
    auto shared = be.alloc(be.activation_dtype(), {t, spec_.hidden_size});
    swiglu(m.shared, h, *shared);
    trace(*shared, "shared_out", layer);
    be.add(out, *shared, out);
  }
}

}  // namespace

StatusOr<std::unique_ptr<Model>> create_deepseek_model(const ModelSpec& spec,
                                                       const WeightStore& weights,
                                                       Backend& backend, const TpRank& tp) {
  auto m = std::make_unique<DeepseekModel>(spec, backend, tp);
  STRATA_RETURN_IF_ERROR(m->load(weights));
  return std::unique_ptr<Model>(std::move(m));
}

}  // namespace strata
