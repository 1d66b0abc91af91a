// An EAGLE-3 drafter's description (issue 26): its config.json as SpecForge and the EAGLE authors
// publish it (architectures ["LlamaForCausalLMEagle3"], model_type "llama") and the tensor names
// SpecForge's state_dict writes. A description only: no weights, no math (arch/eagle3.h runs it).
//
// config.json: the Llama fields of its one decoder layer (hidden_size, heads, head_dim,
// intermediate_size, rms_norm_eps, rope, vocab_size = the target's vocabulary), plus
//   draft_vocab_size                              lm_head's rows (absent: vocab_size, no d2t)
//   target_hidden_size                            the target's H when it differs (fc is 3·H_t → H)
//   eagle_config.eagle_aux_hidden_state_layer_ids the target layers whose outputs fc reads
//                                                 (absent: SGLang's default [1, L/2-1, L-4])
//   bias                                          fc has a bias (SGLang's getattr(config, "bias"))
// Tensors: fc.weight [H, 3·H_t] (fc.bias), midlayer.{hidden_norm, input_layernorm,
// post_attention_layernorm}.weight [H], midlayer.self_attn.{q,k,v}_proj.weight [*, 2H] (inputs:
// [input_layernorm(embedding) ; hidden_norm(hidden)]), midlayer.self_attn.o_proj.weight,
// midlayer.mlp.{gate,up,down}_proj.weight, norm.weight, lm_head.weight [draft_vocab, H],
// d2t [draft_vocab] int64 (target id = i + d2t[i]), t2d [vocab] bool (unused here), and
// optionally embed_tokens.weight [vocab, H] (absent: the target's embeddings).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/spec.h"

namespace strata {

struct Eagle3Spec {
  ModelSpec layer;                 // the decoder layer's Llama fields (num_layers 1)
  int64_t draft_vocab_size = 0;    // lm_head rows
  bool has_d2t = true;             // false when draft_vocab_size is absent (the full vocabulary)
  int target_hidden_size = 0;      // H_t: fc reads 3 · H_t
  std::vector<int> aux_layer_ids;  // empty: the target's default (eagle3_aux_layers)
  bool fc_bias = false;
};

// True when config.json describes an EAGLE-3 drafter (architectures holds
// "LlamaForCausalLMEagle3" or "Eagle3LlamaForCausalLM").
bool is_eagle3_config(const nlohmann::json& config);

// Parses a drafter's config.json object; `file` names it in errors. Refused: more than one
// decoder layer, tied embeddings, a non-llama model_type, aux layer ids that are not 3 distinct
// non-negative integers.
StatusOr<Eagle3Spec> parse_eagle3_spec(const nlohmann::json& config, const std::string& file);
// Reads `dir`/config.json.
StatusOr<Eagle3Spec> load_eagle3_spec(const std::string& dir);

// The target layers whose outputs the drafter reads: the config's ids, or SGLang's and
// SpecForge's default [1, L/2 - 1, L - 4] for a target of `target_layers` layers. Errors: an id
// outside the target.
StatusOr<std::vector<int>> eagle3_aux_layers(const Eagle3Spec& spec, int target_layers);

// Tensor names as SpecForge writes them.
namespace eagle3_names {
inline constexpr const char* kFc = "fc";
inline constexpr const char* kHiddenNorm = "midlayer.hidden_norm.weight";
inline constexpr const char* kInputNorm = "midlayer.input_layernorm.weight";
inline constexpr const char* kPostNorm = "midlayer.post_attention_layernorm.weight";
inline constexpr const char* kQProj = "midlayer.self_attn.q_proj";
inline constexpr const char* kKProj = "midlayer.self_attn.k_proj";
inline constexpr const char* kVProj = "midlayer.self_attn.v_proj";
inline constexpr const char* kOProj = "midlayer.self_attn.o_proj";
inline constexpr const char* kGateProj = "midlayer.mlp.gate_proj";
inline constexpr const char* kUpProj = "midlayer.mlp.up_proj";
inline constexpr const char* kDownProj = "midlayer.mlp.down_proj";
inline constexpr const char* kNorm = "norm.weight";
inline constexpr const char* kLmHead = "lm_head";
inline constexpr const char* kD2t = "d2t";
inline constexpr const char* kEmbed = "embed_tokens.weight";
}  // namespace eagle3_names

}  // namespace strata
