// model/eagle3_config: an EAGLE-3 drafter's config.json as SpecForge writes it and as published
// drafters ship it (without draft_vocab_size, target_hidden_size or eagle_config), and refusals.
#include "model/eagle3_config.h"

#include <gtest/gtest.h>

namespace strata {
namespace {

nlohmann::json drafter_config() {
  return nlohmann::json::parse(R"({
    "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
    "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
    "num_key_value_heads": 8, "num_hidden_layers": 1, "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "vocab_size": 128256,
    "draft_vocab_size": 32000, "target_hidden_size": 5120,
    "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 29, 57], "use_aux_hidden_state": true}
  })");
}

TEST(Eagle3Config, ReadsSpecForgesFields) {
  auto s = parse_eagle3_spec(drafter_config(), "config.json");
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(s->draft_vocab_size, 32000);
  EXPECT_TRUE(s->has_d2t);
  EXPECT_EQ(s->target_hidden_size, 5120);
  EXPECT_EQ(s->aux_layer_ids, (std::vector<int>{1, 29, 57}));
  EXPECT_FALSE(s->fc_bias);
  EXPECT_EQ(s->layer.head_dim, 128);
  EXPECT_EQ(s->layer.num_kv_heads, 8);
  EXPECT_EQ(s->layer.vocab_size, 128256);
  auto layers = eagle3_aux_layers(*s, 64);
  ASSERT_TRUE(layers.ok());
  EXPECT_EQ(*layers, (std::vector<int>{1, 29, 57}));
  EXPECT_FALSE(eagle3_aux_layers(*s, 40).ok());  // layer 57 is outside a 40-layer target
}

TEST(Eagle3Config, DefaultsOfAMinimalConfig) {
  auto c = drafter_config();
  c.erase("draft_vocab_size");
  c.erase("target_hidden_size");
  c.erase("eagle_config");
  c["bias"] = true;
  auto s = parse_eagle3_spec(c, "config.json");
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(s->draft_vocab_size, 128256);
  EXPECT_FALSE(s->has_d2t);
  EXPECT_EQ(s->target_hidden_size, 4096);
  EXPECT_TRUE(s->fc_bias);
  auto layers = eagle3_aux_layers(*s, 32);  // SGLang's default: [1, L/2 - 1, L - 4]
  ASSERT_TRUE(layers.ok());
  EXPECT_EQ(*layers, (std::vector<int>{1, 15, 28}));
}

TEST(Eagle3Config, Refusals) {
  auto refused = [](const nlohmann::json& c, const std::string& what) {
    auto s = parse_eagle3_spec(c, "d/config.json");
    ASSERT_FALSE(s.ok()) << what;
    EXPECT_NE(s.status().message().find(what), std::string::npos) << s.status().message();
    EXPECT_NE(s.status().message().find("d/config.json"), std::string::npos);
  };
  auto c = drafter_config();
  c["architectures"] = {"LlamaForCausalLM"};
  refused(c, "not an EAGLE-3 drafter");
  c = drafter_config();
  c["num_hidden_layers"] = 2;
  refused(c, "more than one decoder layer");
  c = drafter_config();
  c["draft_vocab_size"] = 200000;
  refused(c, "exceeds vocab_size");
  c = drafter_config();
  c["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = {1, 2};
  refused(c, "must list 3 layer ids");
  c = drafter_config();
  c["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = {1, -2, 3};
  refused(c, "not a distinct layer id");
  c = drafter_config();
  c["model_type"] = "qwen3";
  refused(c, "a llama layer");
  c = drafter_config();
  c["target_hidden_size"] = "big";
  refused(c, "'target_hidden_size' must be a positive integer");
}

}  // namespace
}  // namespace strata
