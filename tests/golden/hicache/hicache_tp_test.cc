// The host KV tier under tensor parallelism on CPU ranks (dist/tp_host_tier.h): with prefixes
// that outgrow the device pool, tp 5 with the tier gives the greedy tokens of tp 1 with and
// without it; rank 0's decisions are tp 1's (the same host hits and promotions), and every rank
// copies them on its own pool: each rank's promoted pages (host hits) and backed-up pages equal
// rank 0's, and its bytes are its own page size's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>

#include "dist/tensor_parallel.h"
#include "engine/engine.h"
#include "support/engine_greedy.h"
#include "support/hicache_workload.h"

namespace strata {
namespace {

struct Case {
  std::string model;
  int page_size;
  std::string policy;
};

struct Outcome {
  std::vector<std::vector<int32_t>> tokens;
  EngineStats stats;
};

Outcome run(const Case& c, int tp, bool tier,
            const std::vector<std::vector<int32_t>>* prompts_in = nullptr,
            std::vector<std::vector<int32_t>>* prompts_out = nullptr) {
  EngineConfig cfg;
  cfg.model_path = std::string(STRATA_SHARED_DIR) + "/models/" + c.model;
  cfg.page_size = c.page_size;
  cfg.max_total_tokens = 96;      // one 48-token prefix and its request fit; two do not
  cfg.chunked_prefill_size = 32;  // prefixes span chunks
  cfg.tp_size = tp;
  cfg.tp_allow_uneven = true;  // 5 heads over 5 ranks; the MLP and vocab in ranges one apart
  if (tier) {
    cfg.enable_hierarchical_cache = true;
    cfg.hicache_ratio = 4;
    cfg.hicache_write_policy = *parse_hicache_write_policy(c.policy);
  }
  auto e = Engine::create(cfg, &tensor_parallel_runtime());
  EXPECT_TRUE(e.ok()) << e.status().to_string();
  if (!e.ok()) return {};
  if (prompts_out) *prompts_out = testing::hicache_workload((*e)->tokenizer());
  Outcome r;
  r.tokens = testing::greedy_tokens(**e, prompts_in ? *prompts_in : *prompts_out, 3,
                                    /*one_at_a_time=*/true);
  r.stats = (*e)->stats();
  return r;
}

class TpHostTier : public ::testing::TestWithParam<Case> {};

TEST_P(TpHostTier, GreedyEqualsTp1AndEveryRankPromotes) {
  const Case& c = GetParam();
  std::vector<std::vector<int32_t>> prompts;
  const Outcome plain = run(c, 1, false, nullptr, &prompts);
  const Outcome tier1 = run(c, 1, true, &prompts);
  const Outcome tier5 = run(c, 5, true, &prompts);
  ASSERT_EQ(plain.tokens.size(), prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(tier1.tokens[i], plain.tokens[i]) << "tp 1 with the tier, request " << i;
    EXPECT_EQ(tier5.tokens[i], plain.tokens[i]) << "tp 5 with the tier, request " << i;
  }
  const HiCacheStats& h1 = tier1.stats.hicache;
  const HiCacheStats& h5 = tier5.stats.hicache;
  EXPECT_GT(h5.host_hit_tokens, 0);
  EXPECT_EQ(h5.host_hit_tokens, h1.host_hit_tokens);  // rank 0 decides as tp 1 does
  EXPECT_EQ(h5.promoted_pages, h1.promoted_pages);
  EXPECT_EQ(h5.backed_up_pages, h1.backed_up_pages);
  EXPECT_LT(tier5.stats.prefill_tokens_total, plain.stats.prefill_tokens_total);

  ASSERT_EQ(tier1.stats.hicache_ranks.size(), 1u);
  EXPECT_EQ(tier1.stats.hicache_ranks[0].pages_to_device, h1.promoted_pages);
  ASSERT_EQ(tier5.stats.hicache_ranks.size(), 5u);
  for (int r = 0; r < 5; ++r) {
    const HostTierRankStats& s = tier5.stats.hicache_ranks[size_t(r)];
    SCOPED_TRACE("rank " + std::to_string(r));
    std::printf(
        "%s %s tp 5 rank %d: %lld pages promoted (%lld B), %lld backed up (%lld B), host %lld B, "
        "copies %.4f s\n",
        c.model.c_str(), c.policy.c_str(), r, (long long)s.pages_to_device,
        (long long)s.bytes_to_device, (long long)s.pages_to_host, (long long)s.bytes_to_host,
        (long long)s.host_bytes, s.copy_seconds);
    EXPECT_EQ(s.rank, r);
    EXPECT_EQ(s.pages_to_device, h5.promoted_pages);  // every rank promotes every hit
    EXPECT_EQ(s.pages_to_host, h5.backed_up_pages);
    EXPECT_GT(s.host_bytes, 0);
    ASSERT_GT(s.pages_to_device, 0);
    // Bytes are this rank's own page size: MLA rows are whole on every rank (the latent is
    // replicated), so every rank's equal rank 0's; GQA rows are this rank's KV heads.
    const int64_t page_bytes = s.bytes_to_device / s.pages_to_device;
    EXPECT_EQ(page_bytes * s.pages_to_device, s.bytes_to_device);
    EXPECT_EQ(page_bytes * s.pages_to_host, s.bytes_to_host);
    EXPECT_EQ(page_bytes, tier5.stats.hicache_ranks[0].bytes_to_device / h5.promoted_pages);
  }
}

INSTANTIATE_TEST_SUITE_P(HouseModels, TpHostTier,
                         ::testing::Values(Case{"house-mla", 16, "write_through"},
                                           Case{"house-llama", 4, "write_back"}),
                         [](const auto& info) {
                           std::string n = info.param.model + "_" + info.param.policy;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

}  // namespace
}  // namespace strata
