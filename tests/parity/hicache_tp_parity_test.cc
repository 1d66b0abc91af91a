// The host KV tier under tensor parallelism on GPUs (issue 32; skipped with fewer than 2 GPUs):
// house-llama at tp 2 (the uneven, test-only split), a prefix-heavy workload whose prefixes
// outgrow the device pool, one request at a time. With the tier (both io backends, write_through
// and write_back) the greedy tokens equal tp 2's without it, rank 0's host hits are those of tp 1
// with the tier, and every rank promoted and backed up the same pages as rank 0. Here the copies
// are asynchronous (their own stream), so a worker's wait for what rank 0 waited for
// (dist/tp_host_tier.h) is what keeps its KV right.
#include <gtest/gtest.h>

#ifdef STRATA_HAVE_NCCL
#include <cuda_runtime.h>

#include <cstdio>

#include "dist/tensor_parallel.h"
#include "engine/engine.h"
#include "support/engine_greedy.h"
#include "support/hicache_workload.h"

namespace strata::testing {
namespace {

struct Outcome {
  std::vector<std::vector<int32_t>> tokens;
  EngineStats stats;
};

Outcome run_house_llama(int tp, const std::string& policy, const std::string& io,
                        std::vector<std::vector<int32_t>>* prompts) {
  EngineConfig c;
  c.model_path = std::string(STRATA_SHARED_DIR) + "/models/house-llama";
  c.device = Device::kCuda;
  c.page_size = 4;
  c.max_total_tokens = 96;  // one 48-token prefix and its request fit; two do not
  c.chunked_prefill_size = 32;
  c.mem_fraction_static = 0.5;
  c.tp_size = tp;
  c.tp_allow_uneven = true;
  c.cuda_graph_max_bs = 0;
  if (!policy.empty()) {
    c.enable_hierarchical_cache = true;
    c.hicache_ratio = 4;
    c.hicache_write_policy = *parse_hicache_write_policy(policy);
    c.hicache_io_backend = *parse_kv_io_backend(io);
  }
  auto e = Engine::create(c, &tensor_parallel_runtime());
  EXPECT_TRUE(e.ok()) << e.status().to_string();
  if (!e.ok()) return {};
  if (prompts->empty()) *prompts = hicache_workload((*e)->tokenizer());
  Outcome out;
  out.tokens = greedy_tokens(**e, *prompts, 8, /*one_at_a_time=*/true);
  out.stats = (*e)->stats();
  return out;
}

TEST(HicacheTpParity, Tp2WithTheTierEqualsTp2WithoutAndEveryRankCopies) {
  int gpus = 0;
  ASSERT_EQ(cudaGetDeviceCount(&gpus), cudaSuccess);
  if (gpus < 2) GTEST_SKIP() << "needs 2+ GPUs, " << gpus << " visible";
  std::vector<std::vector<int32_t>> prompts;
  const Outcome plain = run_house_llama(2, "", "", &prompts);
  ASSERT_EQ(plain.tokens.size(), prompts.size());
  for (const std::string policy : {"write_through", "write_back"}) {
    for (const std::string io : {"kernel", "direct"}) {
      SCOPED_TRACE(policy + " " + io);
      const Outcome tier1 = run_house_llama(1, policy, io, &prompts);
      const Outcome tier2 = run_house_llama(2, policy, io, &prompts);
      int same = 0;
      for (size_t i = 0; i < prompts.size(); ++i) same += tier2.tokens[i] == plain.tokens[i];
      const HiCacheStats& h = tier2.stats.hicache;
      std::printf(
          "house-llama tp 2 %s %s: identical greedy outputs %d/%zu; host hits %lld tokens (tp 1: "
          "%lld)\n",
          policy.c_str(), io.c_str(), same, prompts.size(), (long long)h.host_hit_tokens,
          (long long)tier1.stats.hicache.host_hit_tokens);
      EXPECT_EQ(same, int(prompts.size()));
      EXPECT_GT(h.host_hit_tokens, 0);
      EXPECT_EQ(h.host_hit_tokens, tier1.stats.hicache.host_hit_tokens);
      ASSERT_EQ(tier2.stats.hicache_ranks.size(), 2u);
      for (const HostTierRankStats& r : tier2.stats.hicache_ranks) {
        std::printf(
            "  rank %d: %lld pages promoted, %lld backed up, %lld + %lld B, copies %.6f s\n",
            r.rank, (long long)r.pages_to_device, (long long)r.pages_to_host,
            (long long)r.bytes_to_device, (long long)r.bytes_to_host, r.copy_seconds);
        EXPECT_EQ(r.pages_to_device, h.promoted_pages) << "rank " << r.rank;
        EXPECT_EQ(r.pages_to_host, h.backed_up_pages) << "rank " << r.rank;
        EXPECT_GT(r.copy_seconds, 0) << "rank " << r.rank;
      }
    }
  }
}

}  // namespace
}  // namespace strata::testing
#endif  // STRATA_HAVE_NCCL
