// config.json -> ModelSpec against every config in shared/ (values checked by hand against the
// files) and against synthetic configs for the layouts and errors the shared files lack.
#include "model/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "model/quant.h"

namespace strata {
namespace {

using json = nlohmann::json;
using ::testing::HasSubstr;

const std::string kShared = STRATA_SHARED_DIR;

ModelSpec load(const std::string& rel) {
  auto spec = load_model_spec(kShared + "/" + rel);
  EXPECT_TRUE(spec.ok()) << rel << ": " << spec.status().to_string();
  return spec.ok() ? spec.value() : ModelSpec{};
}

TEST(ConfigTest, EveryConfigInSharedParses) {
  int n = 0;
  for (const char* sub : {"fixtures/tiny", "models", "configs"}) {
    for (const auto& e : std::filesystem::directory_iterator(kShared + "/" + sub)) {
      if (!std::filesystem::exists(e.path() / "config.json")) continue;
      auto spec = load_model_spec(e.path().string());
      EXPECT_TRUE(spec.ok()) << e.path() << ": " << spec.status().to_string();
      if (!spec.ok()) continue;
      ++n;
      EXPECT_GT(spec->head_dim, 0);
      EXPECT_GT(spec->rope.rotary_dim, 0);
      EXPECT_FALSE(spec->eos_token_ids.empty()) << e.path();
    }
  }
  EXPECT_EQ(n, 8 + 2 + 7);  // tiny fixtures, house models, configs
}

TEST(ConfigTest, LlamaGqa) {
  ModelSpec s = load("fixtures/tiny/llama-gqa");
  EXPECT_EQ(s.arch, ArchKind::kLlama);
  EXPECT_EQ(s.model_type, "llama");
  EXPECT_EQ(s.text_model_type, "llama");
  EXPECT_EQ(s.vocab_size, 512);
  EXPECT_EQ(s.hidden_size, 64);
  EXPECT_EQ(s.intermediate_size, 128);
  EXPECT_EQ(s.num_layers, 2);
  EXPECT_EQ(s.num_heads, 4);
  EXPECT_EQ(s.num_kv_heads, 2);
  EXPECT_EQ(s.head_dim, 16);
  EXPECT_EQ(s.rope.type, RopeType::kDefault);
  EXPECT_EQ(s.rope.theta, 10000.0);
  EXPECT_EQ(s.rope.rotary_dim, 16);
  EXPECT_FALSE(s.rope.interleaved);
  EXPECT_FALSE(s.tie_word_embeddings);
  EXPECT_FALSE(s.attention_bias);
  EXPECT_FALSE(s.qk_norm);
  EXPECT_EQ(s.eos_token_ids, std::vector<int>{1});
  EXPECT_FALSE(s.bos_token_id.has_value());
  EXPECT_EQ(s.weight_dtype, DType::kBF16);
  EXPECT_EQ(s.max_position_embeddings, 512);
  EXPECT_EQ(s.weight_prefix, "model.");
  EXPECT_EQ(s.lm_head_name, "lm_head.weight");
  EXPECT_EQ(s.quant.method, QuantMethod::kNone);
  EXPECT_EQ(s.moe.n_routed_experts, 0);
}

TEST(ConfigTest, LlamaTiedAndRopeScaled) {
  ModelSpec tied = load("fixtures/tiny/llama-tied-mha");
  EXPECT_TRUE(tied.tie_word_embeddings);
  EXPECT_EQ(tied.num_kv_heads, 4);
  EXPECT_EQ(tied.rope.theta, 500000.0);

  ModelSpec s = load("fixtures/tiny/llama3-ropescaled");
  EXPECT_EQ(s.rope.type, RopeType::kLlama3);
  EXPECT_EQ(s.rope.factor, 8.0);
  EXPECT_EQ(s.rope.low_freq_factor, 1.0);
  EXPECT_EQ(s.rope.high_freq_factor, 4.0);
  EXPECT_EQ(s.rope.original_max_position_embeddings, 64);
  EXPECT_EQ(s.rope.theta, 500000.0);
  EXPECT_EQ(s.num_kv_heads, 1);
}

TEST(ConfigTest, Qwen2BiasAndQwen3QkNorm) {
  ModelSpec q2 = load("fixtures/tiny/qwen2-bias");
  EXPECT_EQ(q2.arch, ArchKind::kLlama);
  EXPECT_TRUE(q2.attention_bias);
  EXPECT_FALSE(q2.attention_out_bias);
  EXPECT_FALSE(q2.qk_norm);
  EXPECT_TRUE(q2.tie_word_embeddings);
  EXPECT_EQ(q2.head_dim, 16);  // no head_dim field: 64 / 4
  EXPECT_EQ(q2.rope.theta, 1e6);
  EXPECT_FALSE(q2.sliding_window.has_value());

  ModelSpec q3 = load("fixtures/tiny/qwen3-qknorm");
  EXPECT_TRUE(q3.qk_norm);
  EXPECT_FALSE(q3.attention_bias);
  EXPECT_FALSE(q3.attention_out_bias);
  EXPECT_EQ(q3.head_dim, 32);  // explicit head_dim != hidden / heads
  EXPECT_EQ(q3.rope.rotary_dim, 32);
}

TEST(ConfigTest, DeepseekV3MlaMoeYarn) {
  ModelSpec s = load("fixtures/tiny/deepseek-v3-mla-moe");
  EXPECT_EQ(s.arch, ArchKind::kDeepseek);
  EXPECT_TRUE(s.is_mla());
  EXPECT_EQ(s.mla.q_lora_rank, 48);
  EXPECT_EQ(s.mla.kv_lora_rank, 32);
  EXPECT_EQ(s.mla.qk_nope_head_dim, 16);
  EXPECT_EQ(s.mla.qk_rope_head_dim, 8);
  EXPECT_EQ(s.mla.v_head_dim, 16);
  EXPECT_EQ(s.head_dim, 24);  // not the config's head_dim (8, the rope dim)
  EXPECT_EQ(s.rope.rotary_dim, 8);
  EXPECT_TRUE(s.rope.interleaved);
  EXPECT_EQ(s.rope.type, RopeType::kYarn);
  EXPECT_EQ(s.rope.factor, 4.0);
  EXPECT_EQ(s.rope.mscale, 1.0);
  EXPECT_EQ(s.rope.mscale_all_dim, 1.0);
  EXPECT_EQ(s.rope.beta_fast, 32.0);
  EXPECT_EQ(s.rope.beta_slow, 1.0);
  EXPECT_EQ(s.rope.original_max_position_embeddings, 128);
  EXPECT_FALSE(s.rope.attention_factor.has_value());
  EXPECT_EQ(s.moe.n_routed_experts, 8);
  EXPECT_EQ(s.moe.n_shared_experts, 1);
  EXPECT_EQ(s.moe.num_experts_per_tok, 2);
  EXPECT_EQ(s.moe.moe_intermediate_size, 32);
  EXPECT_EQ(s.moe.first_k_dense_replace, 1);
  EXPECT_EQ(s.moe.n_group, 4);
  EXPECT_EQ(s.moe.topk_group, 2);
  EXPECT_TRUE(s.moe.norm_topk_prob);
  EXPECT_EQ(s.moe.routed_scaling_factor, 2.5);
  EXPECT_EQ(s.moe.scoring_func, ScoringFunc::kSigmoid);  // absent in the file: V3 means sigmoid
  EXPECT_EQ(s.moe.topk_method, TopkMethod::kNoauxTc);
  EXPECT_FALSE(s.is_moe_layer(0));
  EXPECT_TRUE(s.is_moe_layer(1));
  EXPECT_TRUE(s.is_moe_layer(2));
}

TEST(ConfigTest, DeepseekV2LiteStyleAndHouseModels) {
  ModelSpec s = load("fixtures/tiny/deepseek-v2lite-style");
  EXPECT_EQ(s.mla.q_lora_rank, 0);
  EXPECT_EQ(s.rope.type, RopeType::kDefault);
  EXPECT_EQ(s.moe.n_group, 1);
  EXPECT_EQ(s.moe.routed_scaling_factor, 1.0);

  ModelSpec mla = load("models/house-mla");
  EXPECT_EQ(mla.mla.q_lora_rank, 160);
  EXPECT_EQ(mla.mla.kv_lora_rank, 128);
  EXPECT_EQ(mla.mla.qk_rope_head_dim, 32);
  EXPECT_EQ(mla.mla.qk_nope_head_dim, 64);
  EXPECT_EQ(mla.mla.v_head_dim, 64);
  EXPECT_EQ(mla.head_dim, 96);
  EXPECT_EQ(mla.num_layers, 8);
  EXPECT_EQ(mla.rms_norm_eps, 1e-5);
  EXPECT_EQ(mla.eos_token_ids, std::vector<int>{0});

  ModelSpec llama = load("models/house-llama");
  EXPECT_EQ(llama.num_heads, 5);
  EXPECT_EQ(llama.num_kv_heads, 1);
  EXPECT_EQ(llama.head_dim, 64);
  EXPECT_EQ(llama.vocab_size, 8192);
  EXPECT_EQ(llama.max_position_embeddings, 4096);
}

TEST(ConfigTest, Int4ExpertsFixture) {
  ModelSpec s = load("fixtures/tiny/deepseek-v3-int4-experts");
  EXPECT_EQ(s.quant.method, QuantMethod::kInt4PackQuantized);
  EXPECT_EQ(s.quant.group_size, 32);
  EXPECT_TRUE(s.quant.symmetric);
  ASSERT_EQ(s.quant.ignore.size(), 4u);
  EXPECT_EQ(s.quant.ignore[0], "lm_head");
  EXPECT_EQ(s.quant.ignore[3], "re:.*mlp\\.(gate|up|gate_up|down)_proj.*");
}

TEST(ConfigTest, RealConfigs) {
  ModelSpec kimi = load("configs/kimi-k2.5");
  EXPECT_EQ(kimi.model_type, "kimi_k25");
  EXPECT_EQ(kimi.text_model_type, "deepseek_v3");
  EXPECT_EQ(kimi.arch, ArchKind::kDeepseek);
  EXPECT_EQ(kimi.weight_prefix, "language_model.model.");
  EXPECT_EQ(kimi.lm_head_name, "language_model.lm_head.weight");
  EXPECT_EQ(kimi.quant.method, QuantMethod::kInt4PackQuantized);
  EXPECT_EQ(kimi.quant.group_size, 32);
  EXPECT_EQ(kimi.num_heads, 64);
  EXPECT_EQ(kimi.num_layers, 61);
  EXPECT_EQ(kimi.moe.n_routed_experts, 384);
  EXPECT_EQ(kimi.moe.routed_scaling_factor, 2.827);
  EXPECT_EQ(kimi.moe.n_group, 1);
  EXPECT_EQ(kimi.rope.theta, 50000.0);
  EXPECT_EQ(kimi.rope.type, RopeType::kYarn);
  EXPECT_EQ(kimi.rope.factor, 64.0);
  EXPECT_EQ(kimi.rope.original_max_position_embeddings, 4096);
  EXPECT_EQ(kimi.rms_norm_eps, 1e-5);
  EXPECT_EQ(kimi.vocab_size, 163840);
  EXPECT_EQ(kimi.bos_token_id, 163584);
  EXPECT_EQ(kimi.eos_token_ids, std::vector<int>{163585});
  EXPECT_EQ(kimi.max_position_embeddings, 262144);

  ModelSpec v3 = load("configs/deepseek-v3");
  EXPECT_EQ(v3.quant.method, QuantMethod::kFp8Block);
  EXPECT_EQ(v3.quant.weight_block_size, (std::vector<int>{128, 128}));
  EXPECT_EQ(v3.num_heads, 128);
  EXPECT_EQ(v3.mla.q_lora_rank, 1536);
  EXPECT_EQ(v3.head_dim, 192);
  EXPECT_EQ(v3.moe.first_k_dense_replace, 3);
  EXPECT_EQ(v3.moe.topk_group, 4);
  EXPECT_EQ(v3.rope.factor, 40.0);
  EXPECT_EQ(v3.bos_token_id, 0);

  ModelSpec v2 = load("configs/deepseek-v2-lite");
  EXPECT_EQ(v2.text_model_type, "deepseek_v2");
  EXPECT_EQ(v2.mla.q_lora_rank, 0);
  EXPECT_EQ(v2.moe.scoring_func, ScoringFunc::kSoftmax);
  EXPECT_EQ(v2.moe.topk_method, TopkMethod::kGreedy);
  EXPECT_FALSE(v2.moe.norm_topk_prob);
  EXPECT_EQ(v2.moe.n_shared_experts, 2);
  EXPECT_EQ(v2.rope.mscale, 0.707);
  EXPECT_EQ(v2.rope.mscale_all_dim, 0.707);
  EXPECT_TRUE(v2.rope.interleaved);

  ModelSpec l31 = load("configs/llama-3.1-8b");
  EXPECT_EQ(l31.eos_token_ids, (std::vector<int>{128001, 128008, 128009}));
  EXPECT_EQ(l31.bos_token_id, 128000);
  EXPECT_EQ(l31.rope.type, RopeType::kLlama3);
  EXPECT_EQ(l31.rope.original_max_position_embeddings, 8192);
  EXPECT_EQ(l31.head_dim, 128);
  EXPECT_EQ(l31.num_kv_heads, 8);

  ModelSpec qwen = load("configs/qwen2.5-7b");
  EXPECT_TRUE(qwen.attention_bias);
  EXPECT_FALSE(qwen.attention_out_bias);
  EXPECT_EQ(qwen.head_dim, 128);                  // 3584 / 28
  EXPECT_FALSE(qwen.sliding_window.has_value());  // use_sliding_window: false
}

json tiny_llama() {
  return json{{"model_type", "llama"},    {"vocab_size", 100},
              {"hidden_size", 32},        {"intermediate_size", 64},
              {"num_hidden_layers", 2},   {"num_attention_heads", 4},
              {"num_key_value_heads", 2}, {"max_position_embeddings", 256},
              {"eos_token_id", 2}};
}

TEST(ConfigTest, TransformersFiveRopeParameters) {
  json c = tiny_llama();
  c["rope_parameters"] = {{"rope_type", "yarn"},
                          {"rope_theta", 20000.0},
                          {"factor", 2.0},
                          {"original_max_position_embeddings", 64},
                          {"attention_factor", 1.25},
                          {"truncate", false}};
  auto s = parse_model_spec(c);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(s->rope.type, RopeType::kYarn);
  EXPECT_EQ(s->rope.theta, 20000.0);
  EXPECT_EQ(s->rope.factor, 2.0);
  EXPECT_EQ(s->rope.original_max_position_embeddings, 64);
  EXPECT_EQ(s->rope.attention_factor, 1.25);
  EXPECT_FALSE(s->rope.truncate);
  EXPECT_EQ(s->head_dim, 8);

  c["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 123.0}};
  s = parse_model_spec(c);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->rope.type, RopeType::kDefault);
  EXPECT_EQ(s->rope.theta, 123.0);

  c.erase("rope_parameters");
  c["rope_scaling"] = {{"type", "linear"}, {"factor", 3.0}};
  s = parse_model_spec(c);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->rope.type, RopeType::kLinear);
  EXPECT_EQ(s->rope.factor, 3.0);

  c["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 2.0}};
  s = parse_model_spec(c);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->rope.type, RopeType::kDynamic);
  EXPECT_EQ(s->rope.original_max_position_embeddings, 256);  // falls back to max positions

  c["rope_scaling"] = {{"rope_type", "longrope"}, {"factor", 2.0}};
  s = parse_model_spec(c);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("longrope"));

  c["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}};
  s = parse_model_spec(c);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("low_freq_factor"));
}

TEST(ConfigTest, BiasFlagsAndTokenIds) {
  json c = tiny_llama();
  c["attention_bias"] = true;
  c["mlp_bias"] = true;
  c["eos_token_id"] = json::array({5, 6});
  c["bos_token_id"] = 1;
  c["head_dim"] = 16;
  auto s = parse_model_spec(c);
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(s->attention_bias);
  EXPECT_TRUE(s->attention_out_bias);  // llama: one flag for q/k/v/o
  EXPECT_TRUE(s->mlp_bias);
  EXPECT_EQ(s->eos_token_ids, (std::vector<int>{5, 6}));
  EXPECT_EQ(s->bos_token_id, 1);
  EXPECT_EQ(s->head_dim, 16);

  c["model_type"] = "qwen2";
  c["attention_bias"] = false;  // the config says otherwise
  s = parse_model_spec(c);
  ASSERT_TRUE(s.ok());
  EXPECT_FALSE(s->attention_bias);
  EXPECT_FALSE(s->mlp_bias);

  c["model_type"] = "mistral";
  c["sliding_window"] = 4096;
  s = parse_model_spec(c);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->sliding_window, 4096);
}

TEST(ConfigTest, Errors) {
  json c = tiny_llama();
  c["model_type"] = "gpt2";
  auto s = parse_model_spec(c);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr("'gpt2'"));
  EXPECT_THAT(s.status().message(), HasSubstr("llama, mistral, qwen2, qwen3, deepseek_v2"));

  c = tiny_llama();
  c.erase("num_attention_heads");
  s = parse_model_spec(c);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("config.json: required field 'num_attention_heads'"));

  c = tiny_llama();
  c["hidden_size"] = "big";
  s = parse_model_spec(c);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("'hidden_size' must be an integer"));

  c = tiny_llama();
  c["quantization_config"] = {{"quant_method", "gptq"}, {"bits", 4}};
  s = parse_model_spec(c);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("quant_method 'gptq' is not supported"));

  c = tiny_llama();
  c["quantization_config"] = {{"quant_method", "compressed-tensors"},
                              {"format", "float-quantized"},
                              {"config_groups", {{"g", {{"weights", {{"num_bits", 8}}}}}}}};
  s = parse_model_spec(c);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("format 'float-quantized'"));

  auto missing = load_model_spec("/nonexistent/model");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("/nonexistent/model/config.json"));

  // A deepseek config names its file and the missing MLA field.
  json d = tiny_llama();
  d["model_type"] = "deepseek_v3";
  s = parse_model_spec(d);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("'kv_lora_rank'"));
}

json kimi_like(bool quant_at_top) {
  json text = tiny_llama();
  text["model_type"] = "deepseek_v3";
  text.update({{"kv_lora_rank", 16},
               {"q_lora_rank", 24},
               {"qk_nope_head_dim", 8},
               {"qk_rope_head_dim", 4},
               {"v_head_dim", 8},
               {"n_routed_experts", 4},
               {"num_experts_per_tok", 2},
               {"moe_intermediate_size", 16},
               {"n_group", 2},
               {"topk_group", 1},
               {"topk_method", "group_limited_greedy"},
               {"scoring_func", "softmax"},
               {"rope_interleave", false}});
  json qc = {{"quant_method", "compressed-tensors"},
             {"format", "pack-quantized"},
             {"config_groups",
              {{"group_0",
                {{"targets", {"Linear"}},
                 {"weights",
                  {{"num_bits", 4},
                   {"type", "int"},
                   {"symmetric", true},
                   {"strategy", "group"},
                   {"group_size", 16}}}}}}},
             {"ignore", {"lm_head", "re:.*self_attn.*"}}};
  json c = {{"model_type", "kimi_k25"}, {"text_config", text}};
  if (quant_at_top) {
    c["quantization_config"] = qc;
  } else {
    c["text_config"]["quantization_config"] = qc;
  }
  return c;
}

TEST(ConfigTest, KimiWrapperQuantInEitherPlace) {
  for (bool top : {true, false}) {
    auto s = parse_model_spec(kimi_like(top));
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    EXPECT_EQ(s->quant.method, QuantMethod::kInt4PackQuantized);
    EXPECT_EQ(s->quant.group_size, 16);
    EXPECT_EQ(s->moe.topk_method, TopkMethod::kGroupLimitedGreedy);
    EXPECT_EQ(s->moe.scoring_func, ScoringFunc::kSoftmax);
    EXPECT_FALSE(s->rope.interleaved);
    EXPECT_EQ(s->head_dim, 12);
    EXPECT_EQ(s->rope.rotary_dim, 4);
  }
  json bad = kimi_like(true);
  bad.erase("text_config");
  auto s = parse_model_spec(bad);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("text_config"));
}

TEST(QuantTest, IsQuantizedModuleHonoursIgnore) {
  ModelSpec s = load("configs/kimi-k2.5");
  const QuantSpec& q = s.quant;
  EXPECT_TRUE(is_quantized_module(q, "language_model.model.layers.3.mlp.experts.7.gate_proj"));
  EXPECT_TRUE(is_quantized_module(q, "language_model.model.layers.3.mlp.experts.0.down_proj"));
  EXPECT_FALSE(is_quantized_module(q, "language_model.model.layers.3.mlp.shared_experts.up_proj"));
  EXPECT_FALSE(is_quantized_module(q, "language_model.model.layers.0.mlp.gate_proj"));  // dense
  EXPECT_FALSE(is_quantized_module(q, "language_model.model.layers.3.self_attn.q_a_proj"));
  EXPECT_FALSE(is_quantized_module(q, "language_model.model.layers.3.mlp.gate"));  // router
  EXPECT_FALSE(is_quantized_module(q, "language_model.lm_head"));
  EXPECT_FALSE(is_quantized_module(q, "lm_head"));
  EXPECT_FALSE(is_quantized_module(q, "language_model.model.embed_tokens"));

  ModelSpec v3 = load("configs/deepseek-v3");
  EXPECT_TRUE(is_quantized_module(v3.quant, "model.layers.0.self_attn.q_a_proj"));
  EXPECT_TRUE(is_quantized_module(v3.quant, "model.layers.5.mlp.experts.3.up_proj"));
  EXPECT_FALSE(is_quantized_module(v3.quant, "lm_head"));
  EXPECT_FALSE(is_quantized_module(v3.quant, "model.layers.5.mlp.gate"));

  EXPECT_FALSE(is_quantized_module(QuantSpec{}, "model.layers.0.mlp.up_proj"));
}

TEST(QuantTest, ParseErrors) {
  auto q = parse_quant_spec(json{{"quant_method", "fp8"}}, "c.json");
  ASSERT_FALSE(q.ok());
  EXPECT_THAT(q.status().message(), HasSubstr("weight_block_size"));
  q = parse_quant_spec(json{{"quant_method", "fp8"}, {"weight_block_size", {128}}}, "c.json");
  ASSERT_FALSE(q.ok());
  q = parse_quant_spec(json{{"quant_method", "fp8"},
                            {"weight_block_size", {128, 64}},
                            {"modules_to_not_convert", {"re:(bad"}}},
                       "c.json");
  ASSERT_FALSE(q.ok());
  EXPECT_THAT(q.status().message(), HasSubstr("bad regex"));
  q = parse_quant_spec(json{{"quant_method", "fp8"}, {"weight_block_size", {128, 64}}}, "c.json");
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->weight_block_size, (std::vector<int>{128, 64}));
}

}  // namespace
}  // namespace strata
