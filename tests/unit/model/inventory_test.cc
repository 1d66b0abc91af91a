#include "model/inventory.h"

#include <gtest/gtest.h>

#include <map>

#include "support/model_specs.h"

namespace strata {
namespace {

const WeightEntry& find(const std::vector<WeightEntry>& inv, const std::string& name) {
  for (const WeightEntry& w : inv) {
    if (w.name == name) return w;
  }
  ADD_FAILURE() << "no tensor " << name;
  static WeightEntry none;
  return none;
}

TEST(Inventory, Llama31_8bParamCount) {
  const ModelSpec spec = testing::llama31_8b_spec();
  const auto inv = build_inventory(spec);
  // 1 embedding + 32 x (2 norms + 4 attention + 3 mlp) + final norm + lm_head.
  EXPECT_EQ(inv.size(), 1u + 32 * 9 + 2);
  const InventorySummary s = summarize_inventory(spec, inv, 1);
  EXPECT_EQ(s.total_params, 8030261248);  // Meta's published count for Llama-3.1-8B
  EXPECT_EQ(s.active_params, s.total_params);
  EXPECT_EQ(s.total_bytes, 2 * s.total_params);
  EXPECT_EQ(s.bf16_bytes, s.total_bytes);
  EXPECT_EQ(s.bytes_per_rank, s.total_bytes);
}

TEST(Inventory, Qwen25_7bWithBiases) {
  const ModelSpec spec = testing::qwen25_7b_spec();
  const auto inv = build_inventory(spec);
  const InventorySummary s = summarize_inventory(spec, inv, 1);
  EXPECT_EQ(s.total_params, 7615616512);  // Qwen2.5-7B: 7.61B
  const WeightEntry& kb = find(inv, "model.layers.0.self_attn.k_proj.bias");
  EXPECT_EQ(kb.shape, (std::vector<int64_t>{512}));
  EXPECT_EQ(kb.sharding, Sharding::kKvHeads);
}

TEST(Inventory, GqaShardingReplicatesKvHeadsBeyondTp) {
  const ModelSpec spec = testing::llama31_8b_spec();
  const auto inv = build_inventory(spec);
  const WeightEntry& q = find(inv, "model.layers.5.self_attn.q_proj.weight");
  const WeightEntry& k = find(inv, "model.layers.5.self_attn.k_proj.weight");
  const WeightEntry& o = find(inv, "model.layers.5.self_attn.o_proj.weight");
  const WeightEntry& down = find(inv, "model.layers.5.mlp.down_proj.weight");
  const WeightEntry& emb = find(inv, "model.embed_tokens.weight");
  EXPECT_EQ(shard_shape(q, 4), (std::vector<int64_t>{1024, 4096}));
  EXPECT_EQ(shard_shape(k, 4), (std::vector<int64_t>{256, 4096}));   // 2 of 8 heads
  EXPECT_EQ(shard_shape(k, 16), (std::vector<int64_t>{128, 4096}));  // 1 head, replicated x2
  EXPECT_EQ(shard_shape(o, 4), (std::vector<int64_t>{4096, 1024}));
  EXPECT_EQ(shard_shape(down, 8), (std::vector<int64_t>{4096, 1792}));
  EXPECT_EQ(shard_shape(emb, 8), (std::vector<int64_t>{16032, 4096}));  // 128256 / 8
  EXPECT_EQ(shard_shape(emb, 3), (std::vector<int64_t>{42752, 4096}));  // pad 128256 -> 128256
}

TEST(Inventory, DeepseekV3TotalAndActive) {
  const ModelSpec spec = testing::deepseek_v3_spec();
  const auto inv = build_inventory(spec);
  const InventorySummary s = summarize_inventory(spec, inv, 8);
  // 671B total / 37B active (DeepSeek's figures, MTP layer excluded here).
  EXPECT_EQ(s.total_params, 671026419200);
  EXPECT_NEAR(double(s.total_params) / 671e9, 1.0, 0.005);
  EXPECT_EQ(s.active_params, 37552297472);  // 37.55B: DeepSeek rounds to "37B"
  // fp8 everywhere except embedding, lm_head, norms and the router.
  EXPECT_EQ(find(inv, "model.layers.0.self_attn.q_a_proj.weight").dtype, DType::kFP8E4M3);
  EXPECT_EQ(find(inv, "model.layers.3.mlp.experts.5.down_proj.weight").dtype, DType::kFP8E4M3);
  EXPECT_EQ(find(inv, "model.layers.3.mlp.gate.weight").dtype, DType::kBF16);
  EXPECT_EQ(find(inv, "model.layers.3.mlp.gate.e_score_correction_bias").dtype, DType::kF32);
  EXPECT_EQ(find(inv, "lm_head.weight").dtype, DType::kBF16);
  const WeightEntry& kvb = find(inv, "model.layers.0.self_attn.kv_b_proj.weight");
  EXPECT_EQ(stored_tensor_names(kvb),
            (std::vector<std::string>{"model.layers.0.self_attn.kv_b_proj.weight",
                                      "model.layers.0.self_attn.kv_b_proj.weight_scale_inv"}));
  // [32768, 512] fp8 + float32 scales per 128x128 block: 256 x 4 blocks.
  EXPECT_EQ(storage_bytes(kvb, kvb.shape, {}), 32768 * 512 + 256 * 4 * 4);
}

TEST(Inventory, KimiK25Int4OnlyRoutedExperts) {
  const ModelSpec spec = testing::kimi_k25_spec();
  const auto inv = build_inventory(spec);
  std::map<WeightRole, std::map<DType, int>> seen;
  for (const WeightEntry& w : inv) seen[w.role][w.dtype]++;
  EXPECT_EQ(seen[WeightRole::kRoutedExpert].size(), 1u);
  EXPECT_EQ(seen[WeightRole::kRoutedExpert][DType::kInt4Packed], 60 * 384 * 3);
  for (WeightRole r : {WeightRole::kAttention, WeightRole::kSharedExpert, WeightRole::kDenseMlp,
                       WeightRole::kLmHead, WeightRole::kEmbedding}) {
    EXPECT_EQ(seen[r].count(DType::kInt4Packed), 0u) << weight_role_name(r);
  }
  const WeightEntry& up = find(inv, "language_model.model.layers.7.mlp.experts.383.up_proj.weight");
  EXPECT_EQ(up.quant, QuantMethod::kInt4PackQuantized);
  EXPECT_EQ(stored_tensor_names(up)[0],
            "language_model.model.layers.7.mlp.experts.383.up_proj.weight_packed");
  // [2048, 7168]: 4 bits per value + a bf16 scale per 32 inputs.
  EXPECT_EQ(storage_bytes(up, up.shape, {}), 2048 * 7168 / 2 + 2048 * (7168 / 32) * 2);
  // TP within each expert: up column-split, down row-split.
  EXPECT_EQ(shard_shape(up, 8), (std::vector<int64_t>{256, 7168}));
  const WeightEntry& down =
      find(inv, "language_model.model.layers.7.mlp.experts.0.down_proj.weight");
  EXPECT_EQ(shard_shape(down, 8), (std::vector<int64_t>{7168, 256}));
  // MLA latent projections replicated; per-head projections split.
  EXPECT_EQ(find(inv, "language_model.model.layers.1.self_attn.q_a_proj.weight").sharding,
            Sharding::kReplicated);
  EXPECT_EQ(find(inv, "language_model.model.layers.1.self_attn.kv_a_proj_with_mqa.weight").sharding,
            Sharding::kReplicated);
  EXPECT_EQ(find(inv, "language_model.model.layers.1.self_attn.q_b_proj.weight").sharding,
            Sharding::kColumn);
  EXPECT_EQ(find(inv, "language_model.model.layers.1.self_attn.o_proj.weight").sharding,
            Sharding::kRow);
  EXPECT_EQ(find(inv, "language_model.model.layers.1.mlp.gate.weight").sharding,
            Sharding::kReplicated);
  EXPECT_EQ(find(inv, "language_model.lm_head.weight").sharding, Sharding::kVocab);
}

TEST(Inventory, KimiK25TotalActiveAndBytes) {
  const ModelSpec spec = testing::kimi_k25_spec();
  const InventorySummary s = summarize_inventory(spec, build_inventory(spec), 8);
  EXPECT_NEAR(double(s.total_params) / 1.026e12, 1.0, 0.005);
  EXPECT_NEAR(double(s.active_params) / 32.9e9, 1.0, 0.005);
  EXPECT_EQ(s.total_params, 1026408232448);
  EXPECT_EQ(s.active_params, 32861500928);
  // Hand count per rank at TP 8: embed + lm_head 587,202,560 (163,840 / 8 rows each, bf16) and
  // the embedding's zero row 14,336 (arch/tp.h); attention + norms 61 x 51,806,208; dense MLP
  // 99,090,432; 60 MoE layers x (router 5,505,024 + bias 1,536 + shared 11,010,048 + INT4
  // experts 1,189,085,184); final norm 14,336.
  EXPECT_EQ(s.bytes_per_rank, 76182607872);
  EXPECT_EQ(s.int4_bytes, 60 * int64_t(384) * 3 * (2048 * 7168 / 2 + 2048 * 224 * 2));
  EXPECT_EQ(s.total_bytes, s.bf16_bytes + s.int4_bytes + s.f32_bytes);
}

}  // namespace
}  // namespace strata
