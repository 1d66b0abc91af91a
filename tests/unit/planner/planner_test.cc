#include "planner/planner.h"

#include <gtest/gtest.h>

#include "support/model_specs.h"

namespace strata {
namespace {

constexpr int64_t kGiB = int64_t(1) << 30;

TEST(KvBytesPerToken, HandComputed) {
  // Llama-3.1-8B: 2 x 8 kv heads x 128 x 32 layers x 2 bytes.
  EXPECT_EQ(kv_bytes_per_token(testing::llama31_8b_spec(), 1, DType::kBF16), 131072);
  EXPECT_EQ(kv_bytes_per_token(testing::llama31_8b_spec(), 2, DType::kBF16), 65536);
  EXPECT_EQ(kv_bytes_per_token(testing::llama31_8b_spec(), 8, DType::kFP8E4M3), 8192);
  // tp 16 > 8 kv heads: one head per rank, replicated.
  EXPECT_EQ(kv_bytes_per_token(testing::llama31_8b_spec(), 16, DType::kBF16), 16384);
  EXPECT_EQ(kv_bytes_per_token(testing::llama31_8b_spec(), 1, DType::kF32), 262144);
  // DeepSeek-V3 MLA: (512 + 64) x 61 layers, the same on every rank.
  EXPECT_EQ(kv_bytes_per_token(testing::deepseek_v3_spec(), 1, DType::kBF16), 70272);
  EXPECT_EQ(kv_bytes_per_token(testing::deepseek_v3_spec(), 8, DType::kBF16), 70272);
  EXPECT_EQ(kv_bytes_per_token(testing::deepseek_v3_spec(), 8, DType::kFP8E4M3), 35136);
  EXPECT_EQ(kv_bytes_per_token(testing::deepseek_v3_spec(), 8, DType::kFP8E5M2), 35136);
  // Two layers kept bf16: 576 x (59 x 1 + 2 x 2).
  EXPECT_EQ(kv_bytes_per_token(testing::deepseek_v3_spec(), 8, DType::kFP8E4M3, {0, 60}), 576 * 63);
}

TEST(DefaultMemFraction, SglangRule) {
  // 95.59 GiB (97,884 MiB), tp 8: reserved 512 + 8192 x 1.5 + 512 x 2 + 1024 = 14,848 MiB.
  EXPECT_DOUBLE_EQ(default_mem_fraction_static(int64_t(97884) << 20, 8), 0.848);
  // H100 80GB (81,559 MiB), tp 1: 512 + 12,288 + 256 x 2 + 128 = 13,440 MiB.
  EXPECT_DOUBLE_EQ(default_mem_fraction_static(int64_t(81559) << 20, 1), 0.835);
  // 24 GiB, tp 1: 512 + 3072 + 48 + 128 = 3760 MiB (no 10 GiB floor below 60 GiB).
  EXPECT_DOUBLE_EQ(default_mem_fraction_static(24 * kGiB, 1), 0.847);
}

Deployment kimi_deployment(double fraction, DType kv) {
  Deployment d;
  d.gpu_memory_bytes = int64_t(95.59 * double(kGiB));
  d.tp_size = 8;
  d.mem_fraction_static = fraction;
  d.kv_cache_dtype = kv;
  return d;
}

// What an SGLang deployment of Kimi-K2.5 on 8 x 95.59 GiB GPUs at TP 8 reported.
TEST(PlanKvCapacity, KimiK25MatchesSglangDeployment) {
  const ModelSpec spec = testing::kimi_k25_spec();
  struct Case {
    double fraction;
    DType kv;
    double sglang_tokens;
  };
  for (const Case& c : {Case{0.85, DType::kBF16, 116e3}, Case{0.88, DType::kBF16, 159e3},
                        Case{0.90, DType::kFP8E4M3, 376e3}}) {
    auto plan = plan_kv_capacity(spec, kimi_deployment(c.fraction, c.kv));
    ASSERT_TRUE(plan.ok()) << plan.status().to_string();
    EXPECT_NEAR(double(plan->kv_tokens) / c.sglang_tokens, 1.0, 0.05)
        << c.fraction << " " << kv_cache_dtype_name(c.kv) << ": " << plan->kv_tokens;
    EXPECT_EQ(plan->weight_bytes_per_rank, 76182607872);
    EXPECT_EQ(plan->kv_pool_bytes, plan->kv_tokens * plan->kv_bytes_per_token);
    EXPECT_EQ(plan->context_length, 262144);
    EXPECT_EQ(plan->req_pool_size, 2048);
    EXPECT_EQ(plan->max_running_requests, 2048);
    EXPECT_FALSE(plan->explanation.empty());
  }
}

TEST(PlanKvCapacity, PagesCapsAndRequests) {
  const ModelSpec spec = testing::kimi_k25_spec();
  Deployment d = kimi_deployment(0.88, DType::kBF16);
  d.page_size = 64;
  auto paged = plan_kv_capacity(spec, d);
  ASSERT_TRUE(paged.ok());
  EXPECT_EQ(paged->kv_tokens % 64, 0);
  EXPECT_LT(paged->profiled_kv_tokens - paged->kv_tokens, 64);

  d.max_total_tokens = 10000;
  d.max_running_requests = 100;
  d.avg_seq_len = 4000;
  d.max_seq_len = 8000;
  auto capped = plan_kv_capacity(spec, d);
  ASSERT_TRUE(capped.ok());
  EXPECT_EQ(capped->kv_tokens, 9984);  // 10000 rounded down to pages of 64
  EXPECT_EQ(capped->max_running_requests, 100);
  EXPECT_EQ(capped->requests_at_avg_len, 2);
  EXPECT_EQ(capped->requests_at_max_len, 1);

  // Without --max-running-requests a small pool limits requests to tokens / 2.
  d.max_running_requests.reset();
  d.max_total_tokens = 1000;
  d.page_size = 1;
  auto small = plan_kv_capacity(spec, d);
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(small->max_running_requests, 500);
}

TEST(PlanKvCapacity, HostTier) {
  const ModelSpec spec = testing::llama31_8b_spec();
  Deployment d;
  d.gpu_memory_bytes = 80 * kGiB;
  d.mem_fraction_static = 0.85;
  d.page_size = 16;
  d.hicache_bytes = int64_t(10e9);
  auto plan = plan_kv_capacity(spec, d);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->host_tier_tokens, int64_t(10e9) / 131072 / 16 * 16);
  d.hicache_bytes = 0;
  d.hicache_ratio = 2.0;
  plan = plan_kv_capacity(spec, d);
  ASSERT_TRUE(plan.ok());
  EXPECT_NEAR(double(plan->host_tier_tokens), 2.0 * double(plan->kv_tokens), 16.0);
}

TEST(PlanKvCapacity, CpuBudgetHasNoCudaTerms) {
  const ModelSpec spec = testing::llama31_8b_spec();
  Deployment d;
  d.device = PlanDevice::kCpu;
  d.gpu_memory_bytes = 32 * kGiB;
  d.mem_fraction_static = 0.9;
  auto plan = plan_kv_capacity(spec, d);
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  EXPECT_EQ(plan->runtime_reserved_bytes, 0);
  // Only the rope table (131072 positions x 128 x f32) loads beside the weights.
  EXPECT_EQ(plan->load_overhead_bytes, 131072 * 128 * 4);
  const int64_t rest = int64_t(0.9 * double(32 * kGiB)) - 2 * 8030261248 - 131072 * 128 * 4;
  EXPECT_EQ(plan->kv_tokens, rest / 131072);
}

TEST(PlanKvCapacity, RejectsBadInput) {
  const ModelSpec spec = testing::llama31_8b_spec();
  Deployment d;
  d.gpu_memory_bytes = 80 * kGiB;
  for (double f : {0.0, 1.0, -0.5, 1.5}) {
    d.mem_fraction_static = f;
    EXPECT_EQ(plan_kv_capacity(spec, d).status().code(), StatusCode::kInvalidArgument) << f;
  }
  d.mem_fraction_static = 0.8;
  d.tp_size = 3;  // 32 heads
  EXPECT_EQ(plan_kv_capacity(spec, d).status().code(), StatusCode::kInvalidArgument);
  d.tp_size = 1;
  d.page_size = 0;
  EXPECT_EQ(plan_kv_capacity(spec, d).status().code(), StatusCode::kInvalidArgument);
  d.page_size = 1;
  d.kv_bf16_layers = {32};
  EXPECT_EQ(plan_kv_capacity(spec, d).status().code(), StatusCode::kInvalidArgument);
  d.kv_bf16_layers = {};
  d.gpu_memory_bytes = 8 * kGiB;  // 16 GB of weights
  auto tight = plan_kv_capacity(spec, d);
  EXPECT_EQ(tight.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(tight.status().message().find("larger tp_size"), std::string::npos);
  d.gpu_memory_bytes = 24 * kGiB;
  d.mem_fraction_static = 0.5;
  tight = plan_kv_capacity(spec, d);
  EXPECT_EQ(tight.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(tight.status().message().find("smallest fraction that fits one page is 0.6"),
            std::string::npos)
      << tight.status().message();
  EXPECT_FALSE(parse_kv_cache_dtype("fp4").ok());
  EXPECT_EQ(*parse_kv_cache_dtype("fp8_e5m2"), DType::kFP8E5M2);
  EXPECT_EQ(*parse_kv_cache_dtype("bfloat16"), DType::kBF16);
}

}  // namespace
}  // namespace strata
