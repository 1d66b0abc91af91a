// Tensor-parallel sharding plan: the split rules per weight, KV-head replication, and the errors
// for sizes that do not divide.
#include "model/sharding.h"

#include <gtest/gtest.h>

#include "model/config.h"

namespace strata {
namespace {

const std::string kShared = STRATA_SHARED_DIR;

ModelSpec llama(int heads, int kv_heads, int inter = 128, int64_t vocab = 512) {
  ModelSpec s;
  s.arch = ArchKind::kLlama;
  s.hidden_size = 64;
  s.num_heads = heads;
  s.num_kv_heads = kv_heads;
  s.head_dim = 16;
  s.intermediate_size = inter;
  s.vocab_size = vocab;
  s.num_layers = 2;
  return s;
}

ModelSpec config(const std::string& name) {
  auto s = load_model_spec(kShared + "/configs/" + name);
  EXPECT_TRUE(s.ok()) << s.status().to_string();
  return s.ok() ? *s : ModelSpec{};
}

TEST(BalancedSplit, CoversEverythingOnce) {
  for (int64_t n : {1, 5, 7, 8, 896}) {
    for (int tp : {1, 2, 3, 4, 8}) {
      int64_t next = 0;
      for (int r = 0; r < tp; ++r) {
        const Range part = balanced_split(n, tp, r);
        EXPECT_EQ(part.begin, next);
        EXPECT_LE(part.size(), (n + tp - 1) / tp);
        EXPECT_GE(part.size(), n / tp);
        next = part.end;
      }
      EXPECT_EQ(next, n);
    }
  }
}

TEST(Sharding, GqaSplitsKvHeadsAndTheirQueryGroups) {
  auto plan = plan_tp_sharding(llama(8, 4), 2);
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  EXPECT_FALSE(plan->kv_heads_replicated());
  EXPECT_EQ(plan->rank(1).kv_heads, (Range{2, 4}));
  EXPECT_EQ(plan->rank(1).q_heads, (Range{4, 8}));
  EXPECT_EQ(plan->rank(1).intermediate, (Range{64, 128}));
  EXPECT_EQ(plan->rank(1).vocab, (Range{256, 512}));
  // Per weight: q rows by heads, k rows by KV heads, o columns, down columns, embedding rows.
  auto q = plan->shard(1, "model.layers.0.self_attn.q_proj.weight", {128, 64});
  ASSERT_TRUE(q.ok()) << q.status().to_string();
  EXPECT_EQ(q->kind, ShardKind::kColumn);
  EXPECT_EQ(q->rows, (Range{64, 128}));
  EXPECT_EQ(q->cols, (Range{0, 64}));
  auto k = plan->shard(1, "model.layers.0.self_attn.k_proj.weight", {64, 64});
  EXPECT_EQ(k->rows, (Range{32, 64}));
  auto o = plan->shard(1, "model.layers.0.self_attn.o_proj.weight", {64, 128});
  EXPECT_EQ(o->kind, ShardKind::kRow);
  EXPECT_EQ(o->rows, (Range{0, 64}));
  EXPECT_EQ(o->cols, (Range{64, 128}));
  auto down = plan->shard(0, "model.layers.1.mlp.down_proj.weight", {64, 128});
  EXPECT_EQ(down->cols, (Range{0, 64}));
  auto up = plan->shard(1, "model.layers.1.mlp.up_proj.weight", {128, 64});
  EXPECT_EQ(up->rows, (Range{64, 128}));
  auto emb = plan->shard(1, "model.embed_tokens.weight", {512, 64});
  EXPECT_EQ(emb->kind, ShardKind::kVocab);
  EXPECT_EQ(emb->rows, (Range{256, 512}));
  auto norm = plan->shard(1, "model.layers.0.input_layernorm.weight", {64});
  EXPECT_EQ(norm->kind, ShardKind::kReplicated);
  EXPECT_EQ(norm->rows, (Range{0, 64}));
  // A row-parallel bias is added once, on rank 0.
  EXPECT_FALSE(plan->shard(0, "model.layers.0.self_attn.o_proj.bias", {64})->empty);
  EXPECT_TRUE(plan->shard(1, "model.layers.0.self_attn.o_proj.bias", {64})->empty);
  // Shapes that do not match the spec, and names without a rule, are errors.
  EXPECT_FALSE(plan->shard(0, "model.layers.0.self_attn.q_proj.weight", {96, 64}).ok());
  EXPECT_FALSE(plan->shard(0, "model.layers.0.mystery.weight", {4, 4}).ok());
}

TEST(Sharding, FewerKvHeadsThanRanksReplicatesThem) {
  auto plan = plan_tp_sharding(llama(8, 2), 4);
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  EXPECT_TRUE(plan->kv_heads_replicated());
  const Range kv[] = {{0, 1}, {0, 1}, {1, 2}, {1, 2}};
  const Range q[] = {{0, 2}, {2, 4}, {4, 6}, {6, 8}};
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(plan->rank(r).kv_heads, kv[r]) << r;
    EXPECT_EQ(plan->rank(r).q_heads, q[r]) << r;
  }
  // Llama-3.1-8B at tp 8: one KV head per rank; tp 16: each replicated twice.
  const ModelSpec l31 = config("llama-3.1-8b");
  auto p8 = plan_tp_sharding(l31, 8);
  ASSERT_TRUE(p8.ok()) << p8.status().to_string();
  EXPECT_FALSE(p8->kv_heads_replicated());
  EXPECT_EQ(p8->rank(7).q_heads, (Range{28, 32}));
  auto p16 = plan_tp_sharding(l31, 16);
  ASSERT_TRUE(p16.ok()) << p16.status().to_string();
  EXPECT_TRUE(p16->kv_heads_replicated());
  EXPECT_EQ(p16->rank(15).kv_heads, (Range{7, 8}));
}

TEST(Sharding, ErrorsNameWhatDoesNotDivide) {
  auto heads = plan_tp_sharding(llama(6, 6), 4);
  ASSERT_FALSE(heads.ok());
  EXPECT_NE(heads.status().message().find("num_key_value_heads 6"), std::string::npos)
      << heads.status().message();
  auto kv = plan_tp_sharding(llama(12, 3, 120, 510),
                             6);  // 6 is a multiple of 3: each KV head on two ranks
  EXPECT_TRUE(kv.ok());
  auto kv_bad = plan_tp_sharding(llama(12, 3), 4);
  ASSERT_FALSE(kv_bad.ok());
  EXPECT_NE(kv_bad.status().message().find("num_key_value_heads 3"), std::string::npos);
  auto inter = plan_tp_sharding(llama(4, 4, /*inter=*/130), 4);
  ASSERT_FALSE(inter.ok());
  EXPECT_NE(inter.status().message().find("intermediate_size 130"), std::string::npos);
  auto vocab = plan_tp_sharding(llama(4, 4, 128, /*vocab=*/510), 4);
  ASSERT_FALSE(vocab.ok());
  EXPECT_NE(vocab.status().message().find("vocab_size 510"), std::string::npos);
  EXPECT_FALSE(plan_tp_sharding(llama(4, 4), 0).ok());
  // The house models have 5 heads: no even split, but the uneven (test-only) plan works.
  auto house = load_model_spec(kShared + "/models/house-llama");
  ASSERT_TRUE(house.ok());
  auto strict = plan_tp_sharding(*house, 2);
  ASSERT_FALSE(strict.ok());
  EXPECT_NE(strict.status().message().find("num_attention_heads 5"), std::string::npos)
      << strict.status().message();
  auto uneven = plan_tp_sharding(*house, 2, {.allow_uneven = true});
  ASSERT_TRUE(uneven.ok()) << uneven.status().to_string();
  EXPECT_EQ(uneven->rank(0).q_heads, (Range{0, 3}));
  EXPECT_EQ(uneven->rank(1).q_heads, (Range{3, 5}));
  EXPECT_EQ(uneven->rank(1).kv_heads, (Range{0, 1}));
}

TEST(Sharding, MlaMoeSplitsHeadsAndExpertIntermediate) {
  const ModelSpec v3 = config("deepseek-v3");
  auto plan = plan_tp_sharding(v3, 8);
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  const RankShard& r3 = plan->rank(3);
  EXPECT_EQ(r3.q_heads, (Range{48, 64}));
  EXPECT_EQ(r3.moe_intermediate, (Range{768, 1024}));  // 2048 / 8
  const std::string l = "model.layers.5.";
  // Replicated: the latent projections and the router.
  for (const char* name :
       {"self_attn.kv_a_proj_with_mqa.weight", "self_attn.q_a_proj.weight", "mlp.gate.weight",
        "mlp.gate.e_score_correction_bias", "self_attn.kv_a_layernorm.weight"}) {
    auto shape = std::string(name).find("bias") != std::string::npos ||
                         std::string(name).find("norm") != std::string::npos
                     ? Shape{512}
                     : Shape{576, 7168};
    auto w = plan->shard(3, l + name, shape);
    ASSERT_TRUE(w.ok()) << name << ": " << w.status().to_string();
    EXPECT_EQ(w->kind, ShardKind::kReplicated) << name;
  }
  auto qb = plan->shard(3, l + "self_attn.q_b_proj.weight", {128 * 192, 1536});
  EXPECT_EQ(qb->rows, (Range{48 * 192, 64 * 192}));
  auto kvb = plan->shard(3, l + "self_attn.kv_b_proj.weight", {128 * 256, 512});
  EXPECT_EQ(kvb->rows, (Range{48 * 256, 64 * 256}));
  auto o = plan->shard(3, l + "self_attn.o_proj.weight", {7168, 128 * 128});
  EXPECT_EQ(o->cols, (Range{48 * 128, 64 * 128}));
  auto eg = plan->shard(3, l + "mlp.experts.17.gate_proj.weight", {2048, 7168});
  EXPECT_EQ(eg->rows, (Range{768, 1024}));
  auto ed = plan->shard(3, l + "mlp.experts.17.down_proj.weight", {7168, 2048});
  EXPECT_EQ(ed->cols, (Range{768, 1024}));
  auto sd = plan->shard(3, l + "mlp.shared_experts.down_proj.weight", {7168, 2048});
  EXPECT_EQ(sd->cols, (Range{768, 1024}));
  // Kimi-K2.5's INT4 experts at tp 8 keep whole groups of 32.
  EXPECT_TRUE(plan_tp_sharding(config("kimi-k2.5"), 8).ok());
  // moe_intermediate 1408 (V2-Lite) does not split over 3.
  auto lite = plan_tp_sharding(config("deepseek-v2-lite"), 3);
  EXPECT_FALSE(lite.ok());
}

}  // namespace
}  // namespace strata
