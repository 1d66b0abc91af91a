// The host KV tier end to end on the house models (CPU): a prefix-heavy workload whose shared
// prefixes exceed the device KV pool gives the same greedy tokens with and without the tier,
// while the tier serves prefixes from host (promoted tokens > 0) and prefill computes fewer
// tokens. Every write policy; flags that cannot apply are errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "support/engine_greedy.h"
#include "support/hicache_workload.h"

namespace strata {
namespace {

const std::string kShared = STRATA_SHARED_DIR;

struct Result {
  std::vector<std::vector<int32_t>> tokens;
  EngineStats stats;
};

// One request at a time, so the device pool holds one prefix and the order of evictions is fixed.
Result run_sequential(Engine& engine, const std::vector<std::vector<int32_t>>& prompts) {
  Result out;
  out.tokens = testing::greedy_tokens(engine, prompts, 3, /*one_at_a_time=*/true);
  out.stats = engine.stats();
  return out;
}

EngineConfig base_config(const std::string& model, int page_size) {
  EngineConfig c;
  c.model_path = kShared + "/models/" + model;
  c.page_size = page_size;
  c.max_total_tokens = 96;      // one 48-token prefix and its request fit; two do not
  c.chunked_prefill_size = 32;  // prefixes span chunks: promotion continues across chunks
  return c;
}

std::unique_ptr<Engine> make(const EngineConfig& c) {
  auto e = Engine::create(c);
  EXPECT_TRUE(e.ok()) << e.status().to_string();
  return e.ok() ? std::move(e).value() : nullptr;
}

struct Case {
  std::string model;
  int page_size;
  std::vector<std::string> policies;
};

class HostTier : public ::testing::TestWithParam<Case> {};

TEST_P(HostTier, SameGreedyOutputsFewerPrefillTokens) {
  const Case& tc = GetParam();
  const EngineConfig off = base_config(tc.model, tc.page_size);
  auto plain = make(off);
  ASSERT_NE(plain, nullptr);
  const auto prompts = testing::hicache_workload(plain->tokenizer());
  const Result ref = run_sequential(*plain, prompts);
  EXPECT_EQ(ref.stats.hicache.promoted_pages, 0);
  EXPECT_EQ(ref.stats.hicache_capacity_tokens, 0);
  for (const std::string& policy : tc.policies) {
    SCOPED_TRACE(policy);
    EngineConfig on = off;
    on.enable_hierarchical_cache = true;
    on.hicache_ratio = 4;
    on.hicache_write_policy = *parse_hicache_write_policy(policy);
    auto engine = make(on);
    ASSERT_NE(engine, nullptr);
    EXPECT_EQ(engine->stats().hicache_capacity_tokens, 4 * engine->kv_capacity_tokens());
    const Result got = run_sequential(*engine, prompts);
    for (size_t i = 0; i < prompts.size(); ++i)
      EXPECT_EQ(got.tokens[i], ref.tokens[i]) << "request " << i;
    const HiCacheStats& h = got.stats.hicache;
    std::printf(
        "%s %s: prefill computed %lld tokens (%lld without the tier), host hits %lld tokens in "
        "%lld "
        "promotions, demoted %lld pages, dropped %lld, %lld B to host, %lld B to device\n",
        tc.model.c_str(), policy.c_str(), (long long)got.stats.prefill_tokens_total,
        (long long)ref.stats.prefill_tokens_total, (long long)h.host_hit_tokens,
        (long long)h.promotions, (long long)h.demoted_pages, (long long)h.dropped_pages,
        (long long)h.bytes_to_host, (long long)h.bytes_to_device);
    EXPECT_GT(h.host_hit_tokens, 0);
    EXPECT_GT(h.promotions, 0);
    EXPECT_GT(h.demoted_pages, 0);
    EXPECT_GT(h.bytes_to_host, 0);
    EXPECT_EQ(h.bytes_to_device,
              h.promoted_pages * h.bytes_to_host / std::max<int64_t>(1, h.backed_up_pages));
    EXPECT_LT(got.stats.prefill_tokens_total, ref.stats.prefill_tokens_total);
    EXPECT_EQ(got.stats.prompt_tokens_total, ref.stats.prompt_tokens_total);
    // Every prompt token is computed or served from a cache tier.
    EXPECT_EQ(got.stats.prefill_tokens_total + got.stats.cache_hit_tokens_total + h.host_hit_tokens,
              got.stats.prompt_tokens_total);
    EXPECT_EQ(got.stats.kv_tokens_used, got.stats.kv_tokens_cached);  // idle: nothing locked
    EXPECT_TRUE(engine->flush_cache());
    EXPECT_EQ(engine->stats().hicache.host_cached_pages, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(HouseModels, HostTier,
                         ::testing::Values(Case{"house-llama",
                                                4,
                                                {"write_through", "write_through_selective",
                                                 "write_back"}},
                                           Case{"house-mla", 16, {"write_back"}}),
                         [](const auto& info) {
                           std::string n = info.param.model;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

TEST(HostTierFlags, InvalidSettingsAreErrors) {
  EngineConfig c = base_config("house-llama", 4);
  c.hicache_ratio = 2;  // without enable_hierarchical_cache
  EXPECT_FALSE(Engine::create(c).ok());
  c.enable_hierarchical_cache = true;
  c.hicache_size_gb = 1;  // and a ratio
  auto both = Engine::create(c);
  ASSERT_FALSE(both.ok());
  EXPECT_NE(both.status().message().find("--hicache-size"), std::string::npos);
  c.hicache_ratio = 0;
  c.hicache_size_gb = 1e-9;  // less than a page
  EXPECT_FALSE(Engine::create(c).ok());
  c.hicache_size_gb = 0;
  c.hicache_ratio = -1;
  EXPECT_FALSE(Engine::create(c).ok());
  c.hicache_ratio = 1;
  // Names are typed at the edge (the flags): a bad one never reaches the engine.
  EXPECT_FALSE(parse_hicache_write_policy("write_sometimes").ok());
  EXPECT_FALSE(parse_kv_io_backend("dma").ok());
  c.hicache_write_policy = HiCacheWritePolicy::kWriteBack;
  c.hicache_io_backend =
      KvIoBackend::kKernel;  // cuda's: logged as not applicable on cpu, memcpy used
  EXPECT_TRUE(Engine::create(c).ok());
}

}  // namespace
}  // namespace strata
