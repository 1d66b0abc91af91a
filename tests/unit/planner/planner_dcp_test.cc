// The planner under decode context parallelism (--dcp-size, arch/dcp.h), on the issue's
// deployment: Kimi-K2.5 from shared/configs, 8 x 95.59 GiB, tp 8, mem_fraction_static 0.88,
// bf16 KV, pages of 16, requests of 4,500 tokens on average.
#include <gtest/gtest.h>

#include "model/config.h"
#include "planner/planner.h"
#include "support/model_specs.h"

namespace strata {
namespace {

constexpr int64_t kGiB = int64_t(1) << 30;

Deployment kimi(int dcp) {
  Deployment d;
  d.gpu_memory_bytes = int64_t(95.59 * double(kGiB));
  d.tp_size = 8;
  d.dcp_size = dcp;
  d.mem_fraction_static = 0.88;
  d.kv_cache_dtype = DType::kBF16;
  d.page_size = 16;
  d.avg_seq_len = 4500;
  return d;
}

TEST(PlanDcp, KimiK25HoldsEightTimesTheTokensAndRequests) {
  auto spec = load_model_spec(std::string(STRATA_SHARED_DIR) + "/configs/kimi-k2.5");
  ASSERT_TRUE(spec.ok()) << spec.status().to_string();
  auto one = plan_kv_capacity(*spec, kimi(1));
  auto eight = plan_kv_capacity(*spec, kimi(8));
  ASSERT_TRUE(one.ok()) << one.status().to_string();
  ASSERT_TRUE(eight.ok()) << eight.status().to_string();
  // The figures at --dcp-size 1: 154,832 tokens (whole pages of 16), 34 requests of 4,500.
  EXPECT_EQ(one->kv_tokens, 154832);
  EXPECT_EQ(one->requests_at_avg_len, 34);  // 154,832 / 4,500 = 34.4
  // Every rank's memory is the same (the latent is (512 + 64) x 61 x 2 B = 70,272 B a token
  // either way); under DCP each rank holds 1/8 of every sequence, so the group holds 8 x.
  EXPECT_EQ(eight->kv_bytes_per_token, one->kv_bytes_per_token);
  EXPECT_EQ(eight->kv_pool_bytes, one->kv_pool_bytes);
  EXPECT_EQ(eight->kv_tokens_per_rank, 154832);
  EXPECT_EQ(eight->kv_tokens, 8 * 154832);  // 1,238,656: no extra rounding (pages of 16 a rank)
  // Request slots: clamp(8 x 154,8xx / 262,144 x 512, 2048, 4096) = 2,419 (2,048 at dcp 1).
  EXPECT_EQ(one->max_running_requests, 2048);
  EXPECT_EQ(eight->max_running_requests,
            int(double(eight->profiled_kv_tokens) * 8 / 262144.0 * 512.0));
  EXPECT_EQ(eight->requests_at_avg_len, 275);  // 1,238,656 / 4,500 = 275.3: 8.1 x 34
  // Traffic per decoded token and layer, per rank: 8 heads a rank, 7 peers; bf16 queries of
  // 512 + 64 values all-gathered, float32 partials of 512 + 1 (LSE) all-to-all'd.
  EXPECT_EQ(eight->dcp_gather_bytes_per_token_layer, 7 * 8 * 576 * 2);      // 64,512
  EXPECT_EQ(eight->dcp_all_to_all_bytes_per_token_layer, 7 * 8 * 513 * 4);  // 114,912
  EXPECT_EQ(one->dcp_gather_bytes_per_token_layer, 0);
  // The data-parallel-attention alternative: q_b (1536 -> 64 x 192), kv_b (512 -> 64 x 256) and
  // o_proj (64 x 128 -> 7168) in bf16, 61 layers, 7/8 more of them on each rank.
  const int64_t per_layer = (1536LL * 64 * 192 + 512LL * 64 * 256 + 64LL * 128 * 7168) * 2;
  EXPECT_EQ(eight->dp_attention_extra_weight_bytes, 61 * per_layer * 7 / 8);
  EXPECT_GT(eight->dp_attention_kv_tokens_per_rank, 0);
  EXPECT_LT(eight->dp_attention_kv_tokens_per_rank, one->kv_tokens);
}

TEST(PlanDcp, RefusesSizesThatDoNotDivideAndModelsWithoutMla) {
  const ModelSpec kimi_spec = testing::kimi_k25_spec();
  Deployment d = kimi(3);
  EXPECT_FALSE(plan_kv_capacity(kimi_spec, d).ok());
  d = kimi(2);
  d.max_total_tokens = 1000;  // caps the group's pool: 500 a rank, pages of 16
  auto capped = plan_kv_capacity(kimi_spec, d);
  ASSERT_TRUE(capped.ok()) << capped.status().to_string();
  EXPECT_EQ(capped->kv_tokens_per_rank, 496);
  EXPECT_EQ(capped->kv_tokens, 992);
  Deployment llama;
  llama.gpu_memory_bytes = 80 * kGiB;
  llama.tp_size = 2;
  llama.dcp_size = 2;
  auto refused = plan_kv_capacity(testing::llama31_8b_spec(), llama);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("MLA"), std::string::npos)
      << refused.status().to_string();
}

}  // namespace
}  // namespace strata
