// The DeepSeek family forward pass: deepseek_v2, deepseek_v3, kimi_k2, kimi_k25 (text model).
// Pre-norm decoder layers: MLA attention in the absorbed form (arch/mla.h) over a cache of
// [latent | rope key] rows, then a dense SwiGLU MLP (layers < first_k_dense_replace) or a MoE
// block (routed experts through Backend::moe_route / moe_experts plus shared experts).
// Semantics follow transformers' modeling_deepseek_v3 (v2 routing where the config asks for it).
#include <algorithm>
#include <functional>
#include <vector>

#include "arch/dcp.h"
#include "arch/decoder.h"
#include "arch/mla.h"
#include "backend/side_branch.h"
#include "model/weight_names.h"
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
  SwiGlu shared;  // n_shared_experts × moe_intermediate_size as one MLP
};

struct DeepseekLayer {
  DeviceTensorPtr input_norm;   // [hidden]
  LinearWeight q_proj;          // [heads · qk_head, hidden] (no q_lora)
  LinearWeight q_a;             // [q_lora_rank, hidden]
  DeviceTensorPtr q_a_norm;     // [q_lora_rank]
  LinearWeight q_b;             // [heads · qk_head, q_lora_rank]
  LinearWeight kv_a;            // [kv_lora_rank + rope, hidden]
  DeviceTensorPtr kv_a_norm;    // [kv_lora_rank]
  MlaAbsorbedWeights absorbed;  // W_UK / W_UV from kv_b_proj
  LinearWeight o_proj;          // [hidden, heads · v_head_dim]
  DeviceTensorPtr post_norm;    // [hidden]
  bool is_moe = false;
  SwiGlu mlp;    // dense layers
  MoeBlock moe;  // MoE layers
};

class DeepseekModel : public DecoderModel {
 public:
  DeepseekModel(const ModelSpec& spec, Backend& backend, const TpRank& tp)
      : DecoderModel(spec, backend, mla_dims(spec).qk_rope_head_dim),
        dims_(mla_dims(spec)),
        side_(side_branches(backend)) {
    tp_ = tp;
    if (tp.active()) dims_.num_heads = int(tp.shard().q_heads.size());  // this rank's heads
    if (tp.dcp_active()) {
      dcp_ops_ = dcp_attention(backend);
      for (int r = 0; r < tp.size(); ++r)
        dcp_group_heads_ = std::max(dcp_group_heads_, int(tp.plan->rank(r).q_heads.size()));
    }
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
  const DeviceTensor& input_norm(int layer) const override {
    return *layers_[size_t(layer)].input_norm;
  }
  const DeviceTensor& post_norm(int layer) const override {
    return *layers_[size_t(layer)].post_norm;
  }
  Status load_attention(const WeightStore& ws, int layer, DeepseekLayer& L);
  StatusOr<SwiGlu> load_swiglu(const WeightStore& ws,
                               const std::function<std::string(std::string_view)>& module,
                               int64_t inter);
  Status load_moe(const WeightStore& ws, int layer, MoeBlock& m);

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
  // Decode context parallelism (arch/dcp.h): the backend's ops (null: none), the most heads a
  // rank has, and this step's local view, rebuilt by the first layer of each forward.
  DcpAttention* dcp_ops_ = nullptr;
  int dcp_group_heads_ = 0;
  DcpLocalBatch dcp_local_;
  // The backend's side branches (backend/side_branch.h; null: none), found once: every layer of
  // every step opens two.
  SideBranches* side_ = nullptr;
  float softmax_scale_ = 1.0f;
  MoeRouteArgs route_args_;
  std::vector<DeepseekLayer> layers_;
};

}  // namespace

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

namespace {

Status DeepseekModel::load_attention(const WeightStore& ws, int l, DeepseekLayer& L) {
  namespace wn = weight_names;
  const ModelSpec& s = spec_;
  Backend& be = *backend_;
  const TpRank& tp = tp_;
  const WeightNames names(s);
  const int64_t hidden = s.hidden_size, heads = s.num_heads;  // full sizes: the loaders shard
  const int64_t q_out = heads * dims_.q_head_dim();
  const bool bias = s.attention_bias;
  if (s.mla.q_lora_rank > 0) {
    const int64_t qr = s.mla.q_lora_rank;
    STRATA_ASSIGN_OR_RETURN(
        L.q_a, load_fused_linear(ws, be, {{names.attn(l, wn::kQAProj), qr}}, hidden, bias));
    STRATA_ASSIGN_OR_RETURN(
        L.q_a_norm,
        load_weight(ws, be, WeightNames::weight(names.attn(l, wn::kQALayerNorm)), {qr}));
    STRATA_ASSIGN_OR_RETURN(
        L.q_b, load_sharded_linear(ws, be, tp, {{names.attn(l, wn::kQBProj), q_out}}, qr, false));
  } else {
    STRATA_ASSIGN_OR_RETURN(
        L.q_proj,
        load_sharded_linear(ws, be, tp, {{names.attn(l, wn::kQProj), q_out}}, hidden, false));
  }
  STRATA_ASSIGN_OR_RETURN(
      L.kv_a,
      load_fused_linear(ws, be, {{names.attn(l, wn::kKvAProj), dims_.cache_dim()}}, hidden, bias));
  STRATA_ASSIGN_OR_RETURN(L.kv_a_norm,
                          load_weight(ws, be, WeightNames::weight(names.attn(l, wn::kKvALayerNorm)),
                                      {dims_.kv_lora_rank}));
  // kv_b_proj becomes the absorbed per-head W_UK / W_UV (arch/mla.h): dense on every backend,
  // whatever the checkpoint's format (an fp8 kv_b_proj is dequantized here, as SGLang does).
  const int64_t kv_b_rows = heads * (dims_.qk_nope_head_dim + dims_.v_head_dim);
  STRATA_ASSIGN_OR_RETURN(HostTensor kv_b,
                          load_shard_f32(ws, tp, WeightNames::weight(names.attn(l, wn::kKvBProj)),
                                         {kv_b_rows, dims_.kv_lora_rank}));
  L.absorbed = split_kv_b(be, kv_b.view, dims_);
  STRATA_ASSIGN_OR_RETURN(L.o_proj,
                          load_sharded_linear(ws, be, tp, {{names.attn(l, wn::kOProj), hidden}},
                                              heads * dims_.v_head_dim, bias));
  return Status();
}

// gate_proj / up_proj / down_proj under `module(proj)`: a dense layer's MLP or the shared experts.
StatusOr<SwiGlu> DeepseekModel::load_swiglu(
    const WeightStore& ws, const std::function<std::string(std::string_view)>& module,
    int64_t inter) {
  namespace wn = weight_names;
  SwiGlu m;
  const int64_t hidden = spec_.hidden_size;
  STRATA_ASSIGN_OR_RETURN(
      m.gate_up, load_sharded_linear(ws, *backend_, tp_,
                                     {{module(wn::kGateProj), inter}, {module(wn::kUpProj), inter}},
                                     hidden, false));
  STRATA_ASSIGN_OR_RETURN(
      m.down,
      load_sharded_linear(ws, *backend_, tp_, {{module(wn::kDownProj), hidden}}, inter, false));
  return m;
}

Status DeepseekModel::load_moe(const WeightStore& ws, int l, MoeBlock& m) {
  namespace wn = weight_names;
  const MoeSpec& ms = spec_.moe;
  Backend& be = *backend_;
  const WeightNames names(spec_);
  const int64_t hidden = spec_.hidden_size, full_inter = ms.moe_intermediate_size;
  // Every rank holds every expert, with its slice of the intermediate dim (model/sharding.h).
  const int64_t inter = tp_.active() ? tp_.shard().moe_intermediate.size() : full_inter;
  const int64_t n = ms.n_routed_experts;
  // The router stays dense (checkpoints never quantize it); it scores experts in float32.
  STRATA_ASSIGN_OR_RETURN(
      m.gate, load_fused_linear(ws, be, {{names.mlp(l, wn::kRouter), n}}, hidden, false));
  const std::string bias_name = names.mlp(l, wn::kRouter) + "." + std::string(wn::kRouterBias);
  if (ms.topk_method == TopkMethod::kNoauxTc || ws.contains(bias_name)) {
    STRATA_ASSIGN_OR_RETURN(HostTensor bias, ws.load_f32(bias_name, {n}));
    m.correction_bias = be.upload(bias.view, DType::kF32);
  }
  // Stack the routed experts in their stored format: gate_up [n, 2 · inter, hidden] (each
  // expert's gate rows, then its up rows) and down [n, hidden, inter], each read in one pass.
  std::vector<std::vector<LinearPart>> gate_up(static_cast<size_t>(n)),
      down(static_cast<size_t>(n));
  for (int e = 0; e < int(n); ++e) {
    gate_up[size_t(e)] = {{names.expert(l, e, wn::kGateProj), full_inter},
                          {names.expert(l, e, wn::kUpProj), full_inter}};
    down[size_t(e)] = {{names.expert(l, e, wn::kDownProj), hidden}};
  }
  STRATA_ASSIGN_OR_RETURN(
      HostLinearWeight gu_all,
      load_stacked_linear_shard(ws, tp_, gate_up, hidden, names.mlp(l, "experts.*.gate_up")));
  CHECK_EQ(gu_all.out, 2 * inter);
  m.experts.gate_up = be.upload_linear(gu_all, Tensor{});
  gu_all = HostLinearWeight();  // its memory goes back to the pool for down_proj
  STRATA_ASSIGN_OR_RETURN(
      HostLinearWeight d_all,
      load_stacked_linear_shard(ws, tp_, down, full_inter, names.mlp(l, "experts.*.down_proj")));
  m.experts.down = be.upload_linear(d_all, Tensor{});
  if (ms.n_shared_experts > 0) {
    m.has_shared = true;
    STRATA_ASSIGN_OR_RETURN(m.shared,
                            load_swiglu(
                                ws, [&](std::string_view p) { return names.shared_expert(l, p); },
                                int64_t(ms.n_shared_experts) * full_inter));
  }
  return Status();
}

Status DeepseekModel::load(const WeightStore& ws) {
  const ModelSpec& s = spec_;
  Backend& be = *backend_;
  const WeightNames names(s);
  const int64_t hidden = s.hidden_size;
  if (s.mla.kv_lora_rank <= 0 || s.mla.qk_rope_head_dim <= 0 || s.mla.v_head_dim <= 0)
    return invalid_argument("{}: MLA needs kv_lora_rank, qk_rope_head_dim and v_head_dim",
                            ws.dir());
  STRATA_RETURN_IF_ERROR(load_embedding_and_head(ws));
  for (int l = 0; l < s.num_layers; ++l) {
    DeepseekLayer L;
    STRATA_ASSIGN_OR_RETURN(
        L.input_norm, load_weight(ws, be, WeightNames::weight(names.input_norm(l)), {hidden}));
    STRATA_ASSIGN_OR_RETURN(L.post_norm,
                            load_weight(ws, be, WeightNames::weight(names.post_norm(l)), {hidden}));
    STRATA_RETURN_IF_ERROR(load_attention(ws, l, L));
    L.is_moe = s.is_moe_layer(l);
    if (L.is_moe) {
      STRATA_RETURN_IF_ERROR(load_moe(ws, l, L.moe));
    } else {
      STRATA_ASSIGN_OR_RETURN(
          L.mlp, load_swiglu(
                     ws, [&](std::string_view p) { return names.mlp(l, p); }, s.intermediate_size));
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
  auto kv_row = be.alloc(act, {t, dims_.cache_dim()});
  const bool dcp = tp_.dcp_active();
  DeviceTensorPtr q_latent = dcp ? nullptr : be.alloc(act, {t, heads, dims_.cache_dim()});
  const MlaInputsArgs inputs = mla_inputs_args(dims_, kLoraNormEps, rope);
  bool inputs_done = false;  // the query and the cache rows by one Backend::mla_query
  // kv_a right after the first linear on h: two linears on one input back to back, which a
  // backend may run as one launch (the CUDA backend's gemv_pair_fusion under graphs).
  if (L.q_a.weight) {
    auto qa = be.alloc(act, {t, spec_.mla.q_lora_rank});
    be.linear(h, L.q_a, *qa);
    be.linear(h, L.kv_a, *kv_row);
    auto qa_norm = be.alloc(act, {t, spec_.mla.q_lora_rank});
    inputs_done = !dcp && be.mla_query({.q_a = *qa,
                                        .q_a_norm = *L.q_a_norm,
                                        .q_a_eps = kLoraNormEps,
                                        .q_b = L.q_b,
                                        .w_uk = *L.absorbed.w_uk,
                                        .kv_row = *kv_row,
                                        .kv_norm = *L.kv_a_norm,
                                        .args = inputs,
                                        .q_a_normed = *qa_norm,
                                        .q = *q,
                                        .q_latent = *q_latent},
                                       kv, layer, batch.attn);
    if (!inputs_done) {
      // The norm out of place, right before q_b: a backend may run the two as one launch (the
      // CUDA backend's gemv_norm_fusion under graphs).
      be.rms_norm(*qa, *L.q_a_norm, kLoraNormEps, *qa_norm);
      be.linear(*qa_norm, L.q_b, *q);
    }
    trace(*qa_norm, "q_a_norm", layer);
  } else {
    be.linear(h, L.q_proj, *q);
    be.linear(h, L.kv_a, *kv_row);
  }
  auto attn = be.alloc(act, {t, heads, dims_.v_head_dim});
  if (dcp) {
    mla_make_cache_rows(be, dims_, *kv_row, *L.kv_a_norm, kLoraNormEps, batch.attn.positions, rope);
    trace(*kv_row, "kv_cache_row", layer);
    // q's rope right after the cache row's (same positions and frequencies): a backend may merge
    // the two into one launch (the CUDA backend does under graphs).
    RopeArgs q_rope = rope;
    q_rope.offset = dims_.qk_nope_head_dim;
    be.rope(*q, batch.attn.positions, q_rope);
    trace(*q, "q_rope", layer);
    if (layer == 0)
      dcp_local_.build(batch.attn, DcpShard{.rank = tp_.dcp->rank(), .size = tp_.dcp->size()},
                       kv.layout().page_size);
    mla_dcp_attention(be, *dcp_ops_, *tp_.dcp, dims_, dcp_group_heads_, L.absorbed, softmax_scale_,
                      *q, *kv_row, kv, layer, dcp_local_, *attn);
  } else {
    if (!inputs_done) {
      // W_UK's per-head products (q's nope columns into q_latent's latent columns) as a side
      // branch beside the cache rows (norm, rope, page write), q's rope and q_latent's rope
      // columns (one launch on the GPU): the two touch disjoint columns.
      if (side_) side_->begin_side_branch(t);
      mla_absorb_q(be, dims_, L.absorbed, *q, *q_latent);
      if (side_) side_->end_side_branch();
      mla_prepare_attention(be, dims_, *kv_row, *L.kv_a_norm, inputs, *q, *q_latent, kv, layer,
                            batch.attn);
      if (side_) side_->join_side_branch();
    }
    trace(*kv_row, "kv_cache_row", layer);
    trace(*q, "q_rope", layer);
    mla_attend_latent(be, dims_, L.absorbed, softmax_scale_, *q_latent, kv, layer, batch.attn,
                      *attn);
  }
  trace(*attn, "attn", layer);
  be.linear(attn->view().reshape({t, heads * dims_.v_head_dim}), L.o_proj, out);
}

void DeepseekModel::swiglu(const SwiGlu& w, const Tensor& h, const Tensor& out) {
  Backend& be = *backend_;
  const int64_t t = h.dim(0), inter = w.down.in_features();
  auto act = be.alloc(be.activation_dtype(), {t, inter});
  be.linear_silu_mul(h, w.gate_up, *act);  // one GEMV with a SwiGLU epilogue on the GPU
  be.linear(*act, w.down, out);
}

void DeepseekModel::moe_block(int layer, const Tensor& h, const Tensor& out) {
  Backend& be = *backend_;
  const MoeBlock& m = layers_[size_t(layer)].moe;
  const int64_t t = h.dim(0), k = route_args_.top_k;
  // The router first, then the shared experts as a side branch (backend/side_branch.h) beside
  // the route and the routed experts; moe_experts_add joins it before it reads their output.
  auto logits = be.alloc(DType::kF32, {t, route_args_.num_experts});
  be.linear(h, m.gate, *logits);
  DeviceTensorPtr shared;
  if (m.has_shared) {
    shared = be.alloc(be.activation_dtype(), {t, spec_.hidden_size});
    if (side_) side_->begin_side_branch(t);
    swiglu(m.shared, h, *shared);
    if (side_) side_->end_side_branch();
  }
  trace(*logits, "router_logits", layer);
  if (m.correction_bias) trace(*m.correction_bias, "router_bias", layer);
  auto ids = be.alloc(DType::kI32, {t, k});
  auto weights = be.alloc(DType::kF32, {t, k});
  be.moe_route(*logits, m.correction_bias ? m.correction_bias->view() : Tensor{}, route_args_, *ids,
               *weights);
  trace(*ids, "topk_ids", layer);
  trace(*weights, "topk_weights", layer);
  if (!m.has_shared) {
    be.moe_experts(h, m.experts, *ids, *weights, out);
    trace(out, "routed_out", layer);
    return;
  }
  // The routed experts' combine adds the shared experts' output (one launch and one rounding
  // fewer on the GPU), which a side branch makes beside the routing (moe_experts_add joins it).
  be.moe_experts_add(h, m.experts, *ids, *weights, *shared, out);
  trace(*shared, "shared_out", layer);
  trace(out, "moe_out", layer);
}

}  // namespace

StatusOr<std::unique_ptr<Model>> create_deepseek_model(const ModelSpec& spec,
                                                       const WeightStore& weights, Backend& backend,
                                                       const TpRank& tp) {
  if (tp.dcp_active() && dcp_attention(backend) == nullptr)
    return unimplemented(
        "--dcp-size {}: the {} backend has no decode-context-parallel MLA attention (an MLA "
        "attention that returns "
        "each row's log-sum-exp over a rank's shard, causal by absolute position, and the LSE "
        "merge op: "
        "backend/dcp_attention.h); run --dcp-size 1",
        tp.dcp->size(), backend.name());
  auto m = std::make_unique<DeepseekModel>(spec, backend, tp);
  STRATA_RETURN_IF_ERROR(m->load(weights));
  return std::unique_ptr<Model>(std::move(m));
}

}  // namespace strata
