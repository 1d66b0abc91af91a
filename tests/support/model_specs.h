// Hand-built ModelSpecs of real models (from their config.json files in shared/configs), so the
// planner and inventory tests do not depend on the config parser.
#pragma once

#include "model/spec.h"

namespace strata::testing {

inline ModelSpec llama31_8b_spec() {
  ModelSpec s;
  s.arch = ArchKind::kLlama;
  s.model_type = s.text_model_type = "llama";
  s.vocab_size = 128256;
  s.hidden_size = 4096;
  s.intermediate_size = 14336;
  s.num_layers = 32;
  s.num_heads = 32;
  s.num_kv_heads = 8;
  s.head_dim = 128;
  s.max_position_embeddings = 131072;
  s.rope.rotary_dim = 128;
  return s;
}

inline ModelSpec qwen25_7b_spec() {
  ModelSpec s = llama31_8b_spec();
  s.model_type = s.text_model_type = "qwen2";
  s.vocab_size = 152064;
  s.hidden_size = 3584;
  s.intermediate_size = 18944;
  s.num_layers = 28;
  s.num_heads = 28;
  s.num_kv_heads = 4;
  s.head_dim = 128;
  s.attention_bias = true;
  s.max_position_embeddings = 32768;
  return s;
}

inline ModelSpec deepseek_v3_spec() {
  ModelSpec s;
  s.arch = ArchKind::kDeepseek;
  s.model_type = s.text_model_type = "deepseek_v3";
  s.vocab_size = 129280;
  s.hidden_size = 7168;
  s.intermediate_size = 18432;
  s.num_layers = 61;
  s.num_heads = 128;
  s.num_kv_heads = 128;
  s.head_dim = 192;
  s.max_position_embeddings = 163840;
  s.mla = {.q_lora_rank = 1536,
           .kv_lora_rank = 512,
           .qk_nope_head_dim = 128,
           .qk_rope_head_dim = 64,
           .v_head_dim = 128};
  s.moe.n_routed_experts = 256;
  s.moe.n_shared_experts = 1;
  s.moe.num_experts_per_tok = 8;
  s.moe.moe_intermediate_size = 2048;
  s.moe.first_k_dense_replace = 3;
  s.moe.n_group = 8;
  s.moe.topk_group = 4;
  s.moe.norm_topk_prob = true;
  s.moe.routed_scaling_factor = 2.5;
  s.moe.scoring_func = ScoringFunc::kSigmoid;
  s.moe.topk_method = TopkMethod::kNoauxTc;
  s.rope.type = RopeType::kYarn;
  s.rope.factor = 40;
  s.rope.original_max_position_embeddings = 4096;
  s.rope.rotary_dim = 64;
  s.quant.method = QuantMethod::kFp8Block;
  s.quant.weight_block_size = {128, 128};
  return s;
}

inline ModelSpec kimi_k25_spec() {
  ModelSpec s = deepseek_v3_spec();
  s.model_type = "kimi_k25";
  s.text_model_type = "deepseek_v3";
  s.vocab_size = 163840;
  s.num_heads = 64;
  s.num_kv_heads = 64;
  s.max_position_embeddings = 262144;
  s.moe.n_routed_experts = 384;
  s.moe.first_k_dense_replace = 1;
  s.moe.n_group = 1;
  s.moe.topk_group = 1;
  s.moe.routed_scaling_factor = 2.827;
  s.rope.theta = 50000;
  s.rope.factor = 64;
  s.quant = {};
  s.quant.method = QuantMethod::kInt4PackQuantized;
  s.quant.group_size = 32;
  s.quant.ignore = {"lm_head", "re:.*self_attn.*", "re:.*shared_experts.*",
                    "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"};
  s.weight_prefix = "language_model.model.";
  s.lm_head_name = "language_model.lm_head.weight";
  return s;
}

}  // namespace strata::testing
