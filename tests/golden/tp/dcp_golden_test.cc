// Decode context parallelism on CPU ranks (arch/dcp.h, --dcp-size): each rank of a DCP group
// holds 1/N of every sequence's latent KV, attends over its shard, and the partials are merged by
// their log-sum-exp. Logits equal tp 1's within float32 rounding (the merge reorders the softmax
// sums: relative max error below 1e-5), greedy continuations through the engine equal tp 1's
// token for token with the prefix cache, chunked prefill, retraction, /flush_cache and the host
// tier at work, and the pool holds N x the replicated tokens.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>

#include "arch/tp.h"
#include "dist/tensor_parallel.h"
#include "dist/tp_driver.h"
#include "engine/engine.h"
#include "model/config.h"
#include "model/weights.h"
#include "support/engine_greedy.h"
#include "support/golden.h"
#include "support/hicache_workload.h"

namespace strata::testing {
namespace {

struct Case {
  std::string name;
  std::string dir;  // model and reference
  int tp;
  int dcp;
  bool uneven;  // house-mla has 5 heads: only the test-only uneven split shards them
};

std::vector<Case> cases() {
  const std::string s = shared_dir();
  std::vector<Case> c;
  for (int tp : {2, 4}) {
    c.push_back({"house_mla", s + "/fixtures/house-mla", tp, tp, true});
    // (deepseek-v3-int4-experts does not shard under tp at all: its experts' slices are below
    // one INT4 group at tp 2.)
    for (const char* n : {"deepseek-v3-mla-moe", "deepseek-v2lite-style"}) {
      std::string name = n;
      std::replace(name.begin(), name.end(), '-', '_');
      c.push_back({name, s + "/fixtures/tiny/" + n, tp, tp, false});
    }
  }
  // Two DCP groups of 2 inside tp 4 (Communicator::split).
  c.push_back({"deepseek_v3_mla_moe", s + "/fixtures/tiny/deepseek-v3-mla-moe", 4, 2, false});
  c.push_back({"house_mla", s + "/fixtures/house-mla", 4, 2, true});
  return c;
}

std::string model_dir(const Case& c) {
  return c.name == "house_mla" ? shared_dir() + "/models/house-mla" : c.dir;
}

class DcpLogits : public ::testing::TestWithParam<Case> {};

// A prefill of most of each reference sequence, then one decode step per remaining token (pool
// pages of 3 tokens: the engine's page is 3 x dcp, so sequences cross pages and shards unevenly).
TEST_P(DcpLogits, EqualTp1) {
  const Case& c = GetParam();
  auto spec = load_model_spec(model_dir(c));
  ASSERT_TRUE(spec.ok()) << spec.status().to_string();
  auto weights = WeightStore::open(model_dir(c), spec->quant);
  ASSERT_TRUE(weights.ok()) << weights.status().to_string();
  auto backend1 = make_cpu_backend();
  auto tp1 = create_model(*spec, *weights, *backend1);
  ASSERT_TRUE(tp1.ok()) << tp1.status().to_string();
  const TpConfig config{.tp_size = c.tp,
                        .dcp_size = c.dcp,
                        .device = Device::kCpu,
                        .sharding = {.allow_uneven = c.uneven}};
  auto factory = make_tp_rank_factory(config);
  ASSERT_TRUE(factory.ok()) << factory.status().to_string();
  std::unique_ptr<Backend> backend0;
  auto tpn = create_tp_model(*spec, *weights, config, *factory, &backend0);
  ASSERT_TRUE(tpn.ok()) << tpn.status().to_string();
  Reference ref(c.dir + "/reference.safetensors");
  ASSERT_TRUE(ref.ok());
  for (int i = 0; ref.has("seq" + std::to_string(i) + ".input_ids"); ++i) {
    const std::string seq = "seq" + std::to_string(i);
    auto ids = ref.i32(seq + ".input_ids");
    SingleSequence one(**tp1, 3 * c.dcp, int(ids.size()));
    SingleSequence many(**tpn, 3, int(ids.size()), DType::kF32, c.dcp);
    const size_t cut = ids.size() * 2 / 3 + 1;
    std::vector<int32_t> head(ids.begin(), ids.begin() + long(cut));
    auto a = one.step(head, true), b = many.step(head, true);
    for (size_t t = cut; t < ids.size(); ++t) {
      auto a2 = one.step({ids[t]}, true), b2 = many.step({ids[t]}, true);
      a.insert(a.end(), a2.begin(), a2.end());
      b.insert(b.end(), b2.begin(), b2.end());
    }
    const double err = rel_max_error(b, a);
    std::printf("%s tp %d dcp %d %s: rel max error vs tp 1 %.3g\n", c.name.c_str(), c.tp, c.dcp,
                seq.c_str(), err);
    EXPECT_LT(err, 1e-5) << seq;
    EXPECT_GT(err, 0.0) << seq << ": bit-identical logits; is the DCP path running at all?";
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, DcpLogits, ::testing::ValuesIn(cases()), [](const auto& info) {
  return info.param.name + "_tp" + std::to_string(info.param.tp) + "_dcp" +
         std::to_string(info.param.dcp);
});

TEST(DcpLoad, RefusesModelsWithoutMla) {
  const std::string dir = shared_dir() + "/fixtures/tiny/llama-gqa";
  auto spec = load_model_spec(dir);
  ASSERT_TRUE(spec.ok());
  auto weights = WeightStore::open(dir, spec->quant);
  ASSERT_TRUE(weights.ok());
  const TpConfig config{.tp_size = 2, .dcp_size = 2, .device = Device::kCpu};
  auto factory = make_tp_rank_factory(config);
  ASSERT_TRUE(factory.ok());
  std::unique_ptr<Backend> backend0;
  auto m = create_tp_model(*spec, *weights, config, *factory, &backend0);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("MLA"), std::string::npos) << m.status().to_string();
}

// ---- the engine ----

struct EngineRun {
  std::vector<std::vector<int32_t>> tokens;
  EngineStats stats;
};

EngineConfig house_mla_config(int tp, int dcp) {
  EngineConfig c;
  c.model_path = shared_dir() + "/models/house-mla";
  c.page_size = 2;             // pages of 2 x dcp tokens for the engine
  c.chunked_prefill_size = 8;  // prompts prefill in several chunks, batched with decodes
  c.tp_size = tp;
  c.dcp_size = dcp;
  c.tp_allow_uneven = true;
  return c;
}

EngineRun run_engine(const EngineConfig& c, const std::vector<std::vector<int32_t>>& prompts,
                     int new_tokens, bool one_at_a_time = false, bool flush_and_repeat = false) {
  auto e = Engine::create(c, &tensor_parallel_runtime());
  EXPECT_TRUE(e.ok()) << e.status().to_string();
  if (!e.ok()) return {};
  EngineRun r;
  r.tokens = greedy_tokens(**e, prompts, new_tokens, one_at_a_time);
  if (flush_and_repeat) {
    EXPECT_TRUE((*e)->flush_cache());
    EXPECT_EQ(greedy_tokens(**e, prompts, new_tokens, one_at_a_time), r.tokens)
        << "after /flush_cache";
  }
  r.stats = (*e)->stats();
  return r;
}

std::vector<std::vector<int32_t>> reference_prompts() {
  Reference ref(shared_dir() + "/fixtures/house-mla/reference.safetensors");
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; ref.has("greedy" + std::to_string(i) + ".prompt_ids"); ++i)
    prompts.push_back(ref.i32("greedy" + std::to_string(i) + ".prompt_ids"));
  prompts.push_back(
      std::vector<int32_t>(prompts[0].begin(), prompts[0].begin() + 5));  // a short one
  // The first prompt again, extended: its pages come from the prefix cache.
  std::vector<int32_t> again = prompts[0];
  again.insert(again.end(), prompts[1].begin(), prompts[1].begin() + 7);
  prompts.push_back(again);
  return prompts;
}

// Greedy tokens equal tp 1's with chunked prefill and the prefix cache (one request at a time, so
// the repeated prompt hits), then again after /flush_cache; the pool holds dcp x the tokens.
TEST(DcpEngine, GreedyEqualsTp1WithPrefixCacheAndFlush) {
  const auto prompts = reference_prompts();
  const int kNew = 12;
  const EngineRun tp1 = run_engine(house_mla_config(1, 1), prompts, kNew, /*one_at_a_time=*/true);
  for (int n : {2, 4}) {
    SCOPED_TRACE("tp " + std::to_string(n) + " dcp " + std::to_string(n));
    const EngineRun dcp = run_engine(house_mla_config(n, n), prompts, kNew, /*one_at_a_time=*/true,
                                     /*flush_and_repeat=*/true);
    EXPECT_EQ(dcp.tokens, tp1.tokens);
    EXPECT_GT(dcp.stats.cache_hit_tokens_total, 0);
    // The uneven split is planned as tp 1, so the replicated figure is tp 1's pool exactly (each
    // rank's pool is whole pages of 2, as tp 1's).
    std::printf("house-mla KV tokens: tp 1 %lld, tp %d dcp %d %lld\n",
                (long long)tp1.stats.kv_tokens_total, n, n, (long long)dcp.stats.kv_tokens_total);
    EXPECT_EQ(dcp.stats.kv_tokens_total, n * tp1.stats.kv_tokens_total);
  }
}

// A pool too small for the batch, admitted optimistically (conservativeness 0.02): decodes run out
// of pages, requests are retracted and recomputed, and still give tp 1's tokens (greedy does not
// depend on the schedule).
TEST(DcpEngine, RetractionKeepsTheTokens) {
  std::vector<std::vector<int32_t>> prompts = reference_prompts();
  for (size_t i = 0, n = prompts.size(); i < n; ++i)  // distinct sequences, no shared prefix
    prompts.push_back(std::vector<int32_t>(prompts[i].begin() + 1, prompts[i].end()));
  const int kNew = 24;
  const EngineRun tp1 = run_engine(house_mla_config(1, 1), prompts, kNew);
  EngineConfig small = house_mla_config(2, 2);
  small.max_total_tokens = 96;  // 48 tokens a rank
  small.schedule_conservativeness = 0.02;
  const EngineRun dcp = run_engine(small, prompts, kNew);
  EXPECT_EQ(dcp.tokens, tp1.tokens);
  EXPECT_GT(dcp.stats.retractions_total, 0) << "the small pool was meant to force retraction";
  EXPECT_EQ(dcp.stats.kv_tokens_total, 96);
}

// The host tier: each rank backs up and promotes its own shard of the same pages; the tokens are
// tp 1's without a tier, and prefixes come back from host memory.
TEST(DcpEngine, HostTierGivesTp1Tokens) {
  EngineConfig plain_cfg = house_mla_config(1, 1);
  plain_cfg.page_size = 16;
  plain_cfg.chunked_prefill_size = 32;
  std::vector<std::vector<int32_t>> prompts;
  {
    auto e = Engine::create(plain_cfg, &tensor_parallel_runtime());
    ASSERT_TRUE(e.ok()) << e.status().to_string();
    prompts = hicache_workload((*e)->tokenizer());
  }
  const EngineRun plain = run_engine(plain_cfg, prompts, 3, /*one_at_a_time=*/true);
  EngineConfig cfg = house_mla_config(2, 2);
  cfg.page_size = 8;  // pages of 16 tokens for the engine, as tp 1's
  cfg.chunked_prefill_size = 32;
  cfg.max_total_tokens = 96;  // one 48-token prefix and its request fit; two do not
  cfg.enable_hierarchical_cache = true;
  cfg.hicache_ratio = 4;
  const EngineRun tier = run_engine(cfg, prompts, 3, /*one_at_a_time=*/true);
  EXPECT_EQ(tier.tokens, plain.tokens);
  EXPECT_GT(tier.stats.hicache.host_hit_tokens, 0);
  ASSERT_EQ(tier.stats.hicache_ranks.size(), 2u);
  for (const HostTierRankStats& s : tier.stats.hicache_ranks) {
    EXPECT_EQ(s.pages_to_device, tier.stats.hicache.promoted_pages) << "rank " << s.rank;
    EXPECT_GT(s.pages_to_device, 0) << "rank " << s.rank;
  }
}

TEST(DcpEngine, RefusesBadSizes) {
  EngineConfig c = house_mla_config(4, 3);
  auto e = Engine::create(c, &tensor_parallel_runtime());
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("--dcp-size 3"), std::string::npos) << e.status().to_string();
  c = house_mla_config(2, 2);
  c.model_path = shared_dir() + "/models/house-llama";
  e = Engine::create(c, &tensor_parallel_runtime());
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("MLA"), std::string::npos) << e.status().to_string();
  c = house_mla_config(4, 4);
  c.page_size = 4;  // an engine page of 16 tokens: chunks of 8 would never advance
  e = Engine::create(c, &tensor_parallel_runtime());
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("below one KV page of 16"), std::string::npos)
      << e.status().to_string();
  c = house_mla_config(2, 2);
  c.tp_one_rank = true;
  e = Engine::create(c, &tensor_parallel_runtime());
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("--tp-one-rank"), std::string::npos)
      << e.status().to_string();
}

}  // namespace
}  // namespace strata::testing
