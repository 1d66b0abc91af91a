// The scheduler + ScheduleState loop driven by random traffic against a fake model whose "KV" is
// the token and position written to each slot: every step checks that each sequence's page table
// reaches exactly its own tokens, so a wrong page table, a reused page or a lost prefix shows up.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <random>

#include "engine/batch_plan.h"
#include "engine/schedule_state.h"

namespace strata {
namespace {

constexpr int32_t kEos = 2;

struct Slot {
  int32_t token = -1;
  int32_t position = -1;
};

struct Harness {
  Harness(const SchedulerConfig& config, int32_t num_pages)
      : pool(num_pages, config.page_size),
        cache(&pool),
        scheduler(config),
        state(config, &pool, &cache, {kEos}),
        kv(size_t(num_pages) * config.page_size) {}

  Request* submit(std::vector<int32_t> prompt, SamplingParams params) {
    requests.push_back(std::make_unique<Request>(next_id++, std::move(prompt), params));
    Status st = state.submit(requests.back().get());
    EXPECT_TRUE(st.ok()) << st.to_string();
    return requests.back().get();
  }

  // Writes the step's tokens into the fake KV and checks every sequence sees its own context.
  void fake_forward(const ScheduledStep& step) {
    BatchPlan plan = BatchPlan::build(step.seqs, pool.page_size());
    AttentionMetadata m = plan.view();
    ASSERT_EQ(m.num_seqs, int(step.seqs.size()));
    for (int i = 0; i < m.num_tokens; ++i)
      kv[m.slot_mapping[i]] = {plan.token_ids[i], m.positions[i]};
    const int32_t page = pool.page_size();
    for (int s = 0; s < m.num_seqs; ++s) {
      const Request& r = *step.seqs[s].request;
      ASSERT_EQ(m.q_indptr[s + 1] - m.q_indptr[s], step.seqs[s].num_new_tokens);
      ASSERT_EQ(m.page_indptr[s + 1] - m.page_indptr[s], (m.kv_lens[s] + page - 1) / page);
      for (int32_t pos = 0; pos < m.kv_lens[s]; ++pos) {
        PageId p = m.page_indices[m.page_indptr[s] + pos / page];
        ASSERT_GE(pool.refcount(p), 1) << "reads a free page";
        const Slot& slot = kv[size_t(p) * page + pos % page];
        ASSERT_EQ(slot.position, pos) << "request " << r.id();
        ASSERT_EQ(slot.token, r.token_at(pos)) << "request " << r.id() << " pos " << pos;
      }
    }
  }

  // One scheduling round: decide, apply, run (maybe several decode steps), complete.
  void round(std::mt19937& rng) {
    ScheduledStep step = state.schedule(scheduler);
    state.check_invariants();
    rejected += step.rejected.size();
    retracted += step.retracted.size();
    for (const ScheduledSeq& s : step.seqs) chunks += !s.sample;
    for (int i = 0; i < step.num_decode_steps && !step.seqs.empty(); ++i) {
      if (i > 0) step = state.continue_decode();
      if (step.seqs.empty()) break;
      fake_forward(step);
      std::vector<int32_t> sampled;
      for (const ScheduledSeq& s : step.seqs)
        if (s.sample) sampled.push_back(rng() % 50 == 0 ? kEos : 3 + rng() % 5);
      state.complete(step, sampled);
      state.check_invariants();
      multi_steps += i > 0;
    }
  }

  PagePool pool;
  RadixCache cache;
  Scheduler scheduler;
  ScheduleState state;
  std::vector<Slot> kv;
  std::vector<std::unique_ptr<Request>> requests;
  int64_t next_id = 1;
  int64_t rejected = 0, retracted = 0, chunks = 0, multi_steps = 0;
};

struct LoopCase {
  int32_t page_size;
  int32_t num_pages;
  int32_t chunked_prefill_size;
  int32_t decode_steps;
  uint32_t seed;
};

class ScheduleLoop : public ::testing::TestWithParam<LoopCase> {};

TEST_P(ScheduleLoop, RandomTrafficKeepsInvariantsAndFinishes) {
  const LoopCase c = GetParam();
  SchedulerConfig config{.page_size = c.page_size,
                         .chunked_prefill_size = c.chunked_prefill_size,
                         .max_prefill_tokens = 64,
                         .max_running_requests = 8,
                         .num_continuous_decode_steps = c.decode_steps};
  Harness h(config, c.num_pages);
  std::mt19937 rng(c.seed);
  const int64_t capacity = h.pool.capacity_tokens();
  // A few shared "system prompts" so the radix cache gets hits.
  std::vector<std::vector<int32_t>> stems;
  for (int i = 0; i < 3; ++i) {
    std::vector<int32_t> s;
    for (int j = 0; j < 8 + int(rng() % 24); ++j) s.push_back(3 + rng() % 7);
    stems.push_back(s);
  }
  int64_t aborted = 0, finished_by_stop_string = 0;
  for (int round = 0; round < 3000; ++round) {
    if (round < 2600 && rng() % 3 == 0) {
      std::vector<int32_t> prompt =
          rng() % 2 ? stems[rng() % stems.size()] : std::vector<int32_t>{};
      int len = 1 + rng() % 40;
      if (rng() % 100 == 0) len = int(capacity);  // never fits with one generated token
      while (int(prompt.size()) < len) prompt.push_back(3 + rng() % 7);
      SamplingParams p{.max_new_tokens = 1 + int(rng() % 40), .ignore_eos = rng() % 4 == 0};
      h.submit(prompt, p);
    }
    if (rng() % 25 == 0) {  // abort a random live request, whatever its state
      std::vector<Request*> live;
      for (auto& r : h.requests)
        if (r->is_live()) live.push_back(r.get());
      if (!live.empty()) {
        Request* r = live[rng() % live.size()];
        h.state.abort(r);
        EXPECT_TRUE(r->pages().empty());
        ++aborted;
        h.state.check_invariants();
      }
    }
    if (rng() % 40 == 0 && !h.state.running().empty()) {  // a stop string matched
      Request* r = h.state.running()[rng() % h.state.running().size()];
      if (r->state() == RequestState::kDecoding) {
        h.state.finish(r, FinishReason::kStop);
        ++finished_by_stop_string;
        h.state.check_invariants();
      }
    }
    h.round(rng);
  }
  // Drain: every request ends without further submissions (no request waits forever).
  int rounds = 0;
  while (h.state.num_waiting() + h.state.num_running() > 0 && rounds++ < 20000) h.round(rng);
  for (auto& r : h.requests) {
    ASSERT_FALSE(r->is_live()) << "request " << r->id() << " never ended";
    if (r->state() == RequestState::kFinished) {
      ASSERT_GE(r->output_len(), 1);
      ASSERT_LE(r->output_len(), r->params().max_new_tokens);
      ASSERT_LE(r->prompt_len() + r->output_len(), capacity);
    }
  }
  EXPECT_TRUE(h.state.flush_cache());
  h.state.check_invariants();
  EXPECT_EQ(h.pool.num_free_pages(), h.pool.num_pages());
  EXPECT_GT(h.rejected, 0);
  EXPECT_GT(aborted, 0);
  EXPECT_GT(h.cache.stats().hit_tokens, 0);
  if (c.chunked_prefill_size > 0) {
    EXPECT_GT(h.chunks, 0);
  }
  if (c.decode_steps > 1) {
    EXPECT_GT(h.multi_steps, 0);
  }
  std::printf(
      "pages %d x %d: %zu requests, %ld rejected, %ld retracted, %ld aborted, %ld chunks, "
      "%ld extra decode steps, hit %ld of %ld lookup tokens, %ld pages evicted\n",
      c.num_pages, c.page_size, h.requests.size(), long(h.rejected), long(h.retracted),
      long(aborted), long(h.chunks), long(h.multi_steps), long(h.cache.stats().hit_tokens),
      long(h.cache.stats().lookup_tokens), long(h.cache.stats().evicted_pages));
}

INSTANTIATE_TEST_SUITE_P(Pools, ScheduleLoop,
                         ::testing::Values(LoopCase{1, 96, 16, 1, 1}, LoopCase{1, 64, 0, 4, 2},
                                           LoopCase{4, 24, 16, 1, 3}, LoopCase{4, 40, 12, 3, 4},
                                           LoopCase{2, 200, 32, 2, 5}, LoopCase{16, 8, 32, 1, 6}),
                         [](const ::testing::TestParamInfo<LoopCase>& i) {
                           const LoopCase& c = i.param;
                           return "page" + std::to_string(c.page_size) + "_pages" +
                                  std::to_string(c.num_pages) + "_chunk" +
                                  std::to_string(c.chunked_prefill_size) + "_steps" +
                                  std::to_string(c.decode_steps);
                         });

}  // namespace
}  // namespace strata
