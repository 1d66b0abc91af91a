// Every shared checkpoint: its config and its weights agree. The names and shapes the
// architectures will ask for exist, and every weight loads as finite float32.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "model/config.h"
#include "model/weights.h"

namespace strata {
namespace {

const std::string kShared = STRATA_SHARED_DIR;

void check_checkpoint(const std::string& dir) {
  SCOPED_TRACE(dir);
  auto spec = load_model_spec(dir);
  ASSERT_TRUE(spec.ok()) << spec.status().to_string();
  auto ws = WeightStore::open(dir, spec->quant);
  ASSERT_TRUE(ws.ok()) << ws.status().to_string();
  const std::string& p = spec->weight_prefix;
  const Shape embed{spec->vocab_size, spec->hidden_size};
  EXPECT_TRUE(ws->load_f32(p + "embed_tokens.weight", embed).ok());
  EXPECT_EQ(ws->contains(spec->lm_head_name), !spec->tie_word_embeddings);
  EXPECT_TRUE(ws->load_f32(p + "norm.weight", {spec->hidden_size}).ok());
  for (int l = 0; l < spec->num_layers; ++l) {
    const std::string a = p + "layers." + std::to_string(l) + ".self_attn.";
    if (spec->is_mla()) {
      const MlaSpec& m = spec->mla;
      const int64_t kv_a = m.kv_lora_rank + m.qk_rope_head_dim;
      EXPECT_TRUE(ws->load_f32(a + "kv_a_proj_with_mqa.weight", {kv_a, spec->hidden_size}).ok());
      EXPECT_TRUE(ws->load_f32(a + "kv_b_proj.weight",
                               {int64_t(spec->num_heads) * (m.qk_nope_head_dim + m.v_head_dim),
                                m.kv_lora_rank})
                      .ok());
      EXPECT_EQ(ws->contains(a + "q_a_proj.weight"), m.q_lora_rank > 0);
    } else {
      const int64_t q = int64_t(spec->num_heads) * spec->head_dim;
      const int64_t kv = int64_t(spec->num_kv_heads) * spec->head_dim;
      EXPECT_TRUE(ws->load_f32(a + "q_proj.weight", {q, spec->hidden_size}).ok());
      EXPECT_TRUE(ws->load_f32(a + "k_proj.weight", {kv, spec->hidden_size}).ok());
      EXPECT_EQ(ws->contains(a + "q_proj.bias"), spec->attention_bias);
      EXPECT_EQ(ws->contains(a + "o_proj.bias"), spec->attention_out_bias);
      EXPECT_EQ(ws->contains(a + "q_norm.weight"), spec->qk_norm);
    }
    const std::string mlp = p + "layers." + std::to_string(l) + ".mlp.";
    if (spec->is_moe_layer(l)) {
      for (int e = 0; e < spec->moe.n_routed_experts; ++e) {
        EXPECT_TRUE(ws->load_f32(mlp + "experts." + std::to_string(e) + ".up_proj.weight",
                                 {spec->moe.moe_intermediate_size, spec->hidden_size})
                        .ok());
      }
      EXPECT_TRUE(ws->contains(mlp + "gate.e_score_correction_bias"));
    } else {
      EXPECT_TRUE(
          ws->load_f32(mlp + "down_proj.weight", {spec->hidden_size, spec->intermediate_size})
              .ok());
    }
  }
  // Every stored float tensor and every packed weight loads and is finite.
  int loaded = 0;
  for (const std::string& name : ws->names()) {
    std::string logical = name;
    if (name.ends_with(".weight_packed")) logical = name.substr(0, name.size() - 7);
    const TensorInfo* t = ws->find(name);
    if (logical == name && t->dtype == DType::kI32) continue;  // weight_shape
    if (name.ends_with("_scale") || name.ends_with("_shape")) continue;
    auto w = ws->load_f32(logical);
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    for (int64_t i = 0; i < w->numel(); ++i) ASSERT_TRUE(std::isfinite(w->f32()[i])) << logical;
    ++loaded;
  }
  EXPECT_GT(loaded, 10);
}

TEST(CheckpointsTest, ConfigAndWeightsAgree) {
  int n = 0;
  for (const char* sub : {"fixtures/tiny", "models"}) {
    for (const auto& e : std::filesystem::directory_iterator(kShared + "/" + sub)) {
      if (!std::filesystem::exists(e.path() / "model.safetensors")) continue;
      check_checkpoint(e.path().string());
      ++n;
    }
  }
  EXPECT_EQ(n, 10);
}

}  // namespace
}  // namespace strata
