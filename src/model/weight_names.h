// The Hugging Face tensor names of the architectures strata loads, spelled in one place. The
// inventory (and through it `strata plan` and the benchmarks' checkpoint writers), the
// tensor-parallel sharding rules, the architectures' loaders and the KV-scale reader all build or
// match names here, so a renamed tensor is one edit.
//
// Names are module paths without the ".weight" / ".bias" suffix
// ("model.layers.3.self_attn.q_proj"); weight(m) and bias(m) add it. Layouts:
//   <prefix>embed_tokens · <prefix>layers.<l>.{input_layernorm, post_attention_layernorm}
//   attention (GQA):  <layer>self_attn.{q_proj, k_proj, v_proj, o_proj, q_norm, k_norm}
//   attention (MLA):  <layer>self_attn.{q_a_proj, q_a_layernorm, q_b_proj | q_proj,
//                     kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj}
//   MLP (dense):      <layer>mlp.{gate_proj, up_proj, down_proj}
//   MoE:              <layer>mlp.gate (router, + e_score_correction_bias),
//                     <layer>mlp.experts.<e>.{gate_proj, up_proj, down_proj},
//                     <layer>mlp.shared_experts.{gate_proj, up_proj, down_proj}
//   <prefix>norm · lm_head (or the embedding when tied)
// where <prefix> is "model." or, for VL wrappers (kimi_k25), "language_model.model." (ModelSpec).
#pragma once

#include <string>
#include <string_view>

#include "model/spec.h"

namespace strata {

// Module names inside a layer's attention or MLP block.
namespace weight_names {
inline constexpr std::string_view kQProj = "q_proj";
inline constexpr std::string_view kKProj = "k_proj";
inline constexpr std::string_view kVProj = "v_proj";
inline constexpr std::string_view kOProj = "o_proj";
inline constexpr std::string_view kQNorm = "q_norm";
inline constexpr std::string_view kKNorm = "k_norm";
inline constexpr std::string_view kQAProj = "q_a_proj";
inline constexpr std::string_view kQALayerNorm = "q_a_layernorm";
inline constexpr std::string_view kQBProj = "q_b_proj";
inline constexpr std::string_view kKvAProj = "kv_a_proj_with_mqa";
inline constexpr std::string_view kKvALayerNorm = "kv_a_layernorm";
inline constexpr std::string_view kKvBProj = "kv_b_proj";
inline constexpr std::string_view kGateProj = "gate_proj";
inline constexpr std::string_view kUpProj = "up_proj";
inline constexpr std::string_view kDownProj = "down_proj";
inline constexpr std::string_view kRouter = "gate";
inline constexpr std::string_view kRouterBias = "e_score_correction_bias";
// Per-layer KV-cache scales some fp8 checkpoints carry under self_attn.
inline constexpr std::string_view kKScale = "k_scale";
inline constexpr std::string_view kVScale = "v_scale";
inline constexpr std::string_view kKvScale = "kv_scale";
}  // namespace weight_names

class WeightNames {
 public:
  explicit WeightNames(const ModelSpec& spec)
      : prefix_(spec.weight_prefix),
        lm_head_(spec.tie_word_embeddings ? spec.weight_prefix + "embed_tokens"
                                          : strip_weight(spec.lm_head_name)) {}

  std::string embed_tokens() const { return prefix_ + "embed_tokens"; }
  std::string final_norm() const { return prefix_ + "norm"; }
  // The output projection's module: the embedding's when the checkpoint ties them.
  const std::string& lm_head() const { return lm_head_; }

  // "<prefix>layers.<l>."
  std::string layer(int l) const { return prefix_ + "layers." + std::to_string(l) + "."; }
  std::string input_norm(int l) const { return layer(l) + "input_layernorm"; }
  std::string post_norm(int l) const { return layer(l) + "post_attention_layernorm"; }
  // <layer>self_attn.<module>
  std::string attn(int l, std::string_view module) const {
    return layer(l) + "self_attn." + std::string(module);
  }
  // <layer>mlp.<module>: a dense layer's MLP, or a MoE layer's router ("gate").
  std::string mlp(int l, std::string_view module) const {
    return layer(l) + "mlp." + std::string(module);
  }
  // <layer>mlp.experts.<e>.<proj>
  std::string expert(int l, int e, std::string_view proj) const {
    return layer(l) + "mlp.experts." + std::to_string(e) + "." + std::string(proj);
  }
  // <layer>mlp.shared_experts.<proj>
  std::string shared_expert(int l, std::string_view proj) const {
    return layer(l) + "mlp.shared_experts." + std::string(proj);
  }

  static std::string weight(const std::string& module) { return module + ".weight"; }
  static std::string bias(const std::string& module) { return module + ".bias"; }
  // "x.weight" -> "x" (names that do not end in ".weight" come back as they are).
  static std::string strip_weight(const std::string& name) {
    return name.ends_with(".weight") ? name.substr(0, name.size() - 7) : name;
  }

 private:
  std::string prefix_;
  std::string lm_head_;
};

}  // namespace strata
