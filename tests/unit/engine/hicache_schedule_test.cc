// ScheduleState with the host KV tier under random traffic: a fake model writes (token, position)
// into each KV slot, a fake copier moves those slots between the device pool and host pages and
// lands its copies late, and every step checks that each sequence's page table reaches exactly its
// own context — so a page promoted from the wrong host page, a page reused while a copy reads it or
// a dropped locked prefix shows up — plus ScheduleState's invariants over both tiers.
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>

#include "engine/batch_plan.h"
#include "engine/schedule_state.h"
#include "kv/hicache.h"
#include "support/late_copier.h"

namespace strata {
namespace {

constexpr int32_t kEos = 2;

struct Slot {
  int32_t token = -1;
  int32_t position = -1;
};

// Copies land late (support/late_copier.h): a page is page_size slots; done() lands each queued
// copy with probability 1/2.
using SlotIo = testing::LateCopier<Slot>;
testing::LateCopierShape slot_pages(int32_t page_size) {
  return {.slots_per_page = page_size,
          .page_bytes = int64_t(page_size) * int64_t(sizeof(Slot)),
          .land_one_in = 2};
}

struct Harness {
  Harness(const SchedulerConfig& config, int32_t num_pages, int32_t host_pages,
          HiCacheWritePolicy policy, uint32_t seed)
      : rng(seed),
        pool(num_pages, config.page_size),
        cache(&pool),
        host(host_pages, config.page_size),
        kv(size_t(num_pages) * config.page_size),
        io(&kv, host_pages, slot_pages(config.page_size), &rng),
        hicache(&pool, &cache, &host, &io, policy),
        scheduler(config),
        state(config, &pool, &cache, {kEos}, &hicache) {}

  void fake_forward(const ScheduledStep& step) {
    BatchPlan plan = BatchPlan::build(step.seqs, pool.page_size());
    AttentionMetadata m = plan.view();
    for (int i = 0; i < m.num_tokens; ++i)
      kv[size_t(m.slot_mapping[i])] = {plan.token_ids[i], m.positions[i]};
    const int32_t page = pool.page_size();
    for (int s = 0; s < m.num_seqs; ++s) {
      const Request& r = *step.seqs[size_t(s)].request;
      for (int32_t pos = 0; pos < m.kv_lens[s]; ++pos) {
        const PageId p = m.page_indices[m.page_indptr[s] + pos / page];
        ASSERT_GE(pool.refcount(p), 1) << "reads a free page";
        const Slot& slot = kv[size_t(p) * page + pos % page];
        ASSERT_EQ(slot.position, pos) << "request " << r.id();
        ASSERT_EQ(slot.token, r.token_at(pos)) << "request " << r.id() << " pos " << pos;
      }
    }
  }

  void round() {
    ScheduledStep step = state.schedule(scheduler);
    state.check_invariants();
    for (int i = 0; i < step.num_decode_steps && !step.seqs.empty(); ++i) {
      if (i > 0) step = state.continue_decode();
      if (step.seqs.empty()) break;
      fake_forward(step);
      if (::testing::Test::HasFatalFailure()) return;
      std::vector<int32_t> sampled;
      for (const ScheduledSeq& s : step.seqs)
        if (s.sample) sampled.push_back(rng() % 50 == 0 ? kEos : 3 + int32_t(rng() % 5));
      state.complete(step, sampled);
      state.check_invariants();
    }
  }

  std::mt19937 rng;
  PagePool pool;
  RadixCache cache;
  HostPool host;
  std::vector<Slot> kv;  // [num_pages * page_size]: what the fake model wrote at each slot
  SlotIo io;
  HiCache hicache;
  Scheduler scheduler;
  ScheduleState state;
  std::vector<std::unique_ptr<Request>> requests;
  int64_t next_id = 1;
};

struct TierCase {
  HiCacheWritePolicy policy;
  int32_t page_size;
  int32_t num_pages;
  int32_t chunked_prefill_size;
  uint32_t seed;
};

class HiCacheSchedule : public ::testing::TestWithParam<TierCase> {};

TEST_P(HiCacheSchedule, RandomTrafficReadsItsOwnContextFromBothTiers) {
  const TierCase c = GetParam();
  SchedulerConfig config{.page_size = c.page_size,
                         .chunked_prefill_size = c.chunked_prefill_size,
                         .max_prefill_tokens = 64,
                         .max_running_requests = 4};
  Harness h(config, c.num_pages, /*host_pages=*/3 * c.num_pages, c.policy, c.seed);
  std::mt19937& rng = h.rng;
  // Shared stems longer than a third of the device pool: they only survive in the host tier.
  std::vector<std::vector<int32_t>> stems;
  for (int i = 0; i < 5; ++i) {
    std::vector<int32_t> s;
    for (int j = 0; j < c.num_pages * c.page_size / 3; ++j) s.push_back(3 + int32_t(rng() % 7));
    stems.push_back(s);
  }
  for (int round = 0; round < 1500 && !::testing::Test::HasFatalFailure(); ++round) {
    if (round < 1300 && rng() % 4 == 0) {
      std::vector<int32_t> prompt = stems[rng() % stems.size()];
      const size_t len = prompt.size() + 1 + rng() % 8;
      while (prompt.size() < len) prompt.push_back(3 + int32_t(rng() % 7));
      SamplingParams p{.max_new_tokens = 1 + int(rng() % 8), .ignore_eos = true};
      h.requests.push_back(std::make_unique<Request>(h.next_id++, std::move(prompt), p));
      ASSERT_TRUE(h.state.submit(h.requests.back().get()).ok());
    }
    if (rng() % 40 == 0) {  // abort a random live request
      for (auto& r : h.requests)
        if (r->is_live()) {
          h.state.abort(r.get());
          h.state.check_invariants();
          break;
        }
    }
    h.round();
  }
  for (int i = 0; i < 20000 && h.state.num_waiting() + h.state.num_running() > 0; ++i) h.round();
  for (auto& r : h.requests) ASSERT_FALSE(r->is_live()) << "request " << r->id() << " never ended";
  const HiCacheStats s = h.hicache.stats();
  EXPECT_GT(s.host_hit_tokens, 0);
  EXPECT_GT(s.demoted_pages, 0);
  // write_back demotes ahead of need once the pool is large enough for a headroom (1/16 of it).
  if (c.policy == HiCacheWritePolicy::kWriteBack && c.num_pages >= 16)
    EXPECT_GT(s.evicted_ahead_pages, 0);
  EXPECT_TRUE(h.state.flush_cache());
  h.state.check_invariants();
  EXPECT_EQ(h.pool.num_free_pages(), h.pool.num_pages());
  EXPECT_EQ(h.host.cached_pages(), 0);
}

INSTANTIATE_TEST_SUITE_P(
    Tiers, HiCacheSchedule,
    ::testing::Values(TierCase{HiCacheWritePolicy::kWriteThrough, 1, 48, 16, 1},
                      TierCase{HiCacheWritePolicy::kWriteThrough, 4, 24, 16, 2},
                      TierCase{HiCacheWritePolicy::kWriteThroughSelective, 2, 40, 12, 3},
                      TierCase{HiCacheWritePolicy::kWriteBack, 1, 48, 0, 4},
                      TierCase{HiCacheWritePolicy::kWriteBack, 4, 24, 8, 5},
                      TierCase{HiCacheWritePolicy::kWriteBack, 16, 8, 32, 6},
                      TierCase{HiCacheWritePolicy::kWriteBack, 1, 160, 16, 7}),
    // Readable, stable names (the default prints the struct's bytes, padding included).
    [](const ::testing::TestParamInfo<TierCase>& info) {
      return std::string(hicache_write_policy_name(info.param.policy)) + "_page" +
             std::to_string(info.param.page_size) + "_seed" + std::to_string(info.param.seed);
    });

}  // namespace
}  // namespace strata
