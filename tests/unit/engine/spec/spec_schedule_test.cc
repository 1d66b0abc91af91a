// Speculative decoding's bookkeeping without a model: a scripted target (the next token is a
// function of the sequence so far) and drafts that are partly right, through ScheduleState with
// decode_tokens_per_step > 1. Outputs must equal plain decoding's, the pool and the radix cache
// must stay consistent every step (check_invariants), pages past the committed tokens must go back
// to the pool, and the cache must end up holding committed tokens only.
#include <gtest/gtest.h>

#include <memory>
#include <random>

#include "engine/schedule_state.h"
#include "engine/spec/verify.h"
#include "engine/spec/verify_shape.h"

namespace strata {
namespace {

// The scripted target: the next token after `tokens`.
int32_t target_next(const std::vector<int32_t>& tokens) {
  const int32_t a = tokens.back(), b = tokens.size() > 1 ? tokens[tokens.size() - 2] : 0;
  return (a * 7 + b * 3 + 1) % 23 + 3;  // never 2 (the EOS below)
}

struct SpecFixture {
  SpecFixture(SchedulerConfig config, int32_t num_pages)
      : config(config),
        pool(num_pages, config.page_size),
        cache(&pool),
        scheduler(config),
        state(config, &pool, &cache, {2}) {}

  Request* submit(std::vector<int32_t> prompt, int32_t max_new) {
    SamplingParams p;
    p.max_new_tokens = max_new;
    p.ignore_eos = true;
    requests.push_back(std::make_unique<Request>(int64_t(requests.size()), std::move(prompt), p));
    EXPECT_TRUE(state.submit(requests.back().get()).ok());
    return requests.back().get();
  }

  // One decision: drafts of up to draft_room tokens, right with probability `right`, and the
  // verify's pad rows (as the engine's EAGLE3 steps: engine/spec/verify_shape.h).
  void round(double right) {
    ScheduledStep step = state.schedule(scheduler);
    state.check_invariants();
    EXPECT_EQ(step.speculative,
              !step.seqs.empty() && step.seqs.back().request->state() == RequestState::kDecoding);
    for (ScheduledSeq& s : step.seqs) {
      if (s.request->state() != RequestState::kDecoding) continue;
      const int32_t room = state.draft_room(*s.request);
      std::vector<int32_t> seq = s.request->tokens(s.request->total_len());
      for (int32_t i = 0; i < room; ++i) {
        const int32_t truth = target_next(seq);
        const int32_t d = coin(rng) < right ? truth : truth + 100;  // a wrong draft
        s.draft.push_back(d);
        seq.push_back(d);
      }
    }
    if (step.speculative && !step.is_prefill) {
      pad_verify_rows(step.seqs, config.decode_tokens_per_step, pool.page_size());
      for (const ScheduledSeq& s : step.seqs) pad_rows += s.pad_rows;
    }
    BatchPlan plan = BatchPlan::build(step.seqs, pool.page_size());
    std::vector<std::vector<int32_t>> committed;
    for (const ScheduledSeq& s : step.seqs) {
      if (!s.sample) continue;
      // The target's token of each row: after the request's tokens and the drafts before it.
      std::vector<int32_t> seq = s.request->tokens(s.request->total_len());
      std::vector<int32_t> rows;
      for (size_t i = 0; i <= s.draft.size(); ++i) {
        rows.push_back(target_next(seq));
        if (i < s.draft.size()) seq.push_back(s.draft[i]);
      }
      const int32_t a = accepted_drafts(rows, s.draft);
      std::vector<int32_t> c(s.draft.begin(), s.draft.begin() + a);
      c.push_back(rows[size_t(a)]);
      drafted += int64_t(s.draft.size());
      accepted += a;
      committed.push_back(std::move(c));
    }
    EXPECT_EQ(plan.logits_rows.size(), [&] {
      size_t n = 0;
      for (const auto& c : step.seqs) n += c.sample ? 1 + c.draft.size() + c.pad_rows : 0;
      return n;
    }());
    state.complete(step, committed);
    state.check_invariants();
    for (const Request* r : state.running())
      if (r->state() == RequestState::kDecoding) {
        // Rolled back: no page past the committed tokens and the next one.
        EXPECT_LE(int64_t(r->pages().size()), pool.pages_for_tokens(r->total_len()));
      }
  }

  SchedulerConfig config;
  PagePool pool;
  RadixCache cache;
  Scheduler scheduler;
  ScheduleState state;
  std::vector<std::unique_ptr<Request>> requests;
  std::mt19937 rng{7};
  std::uniform_real_distribution<double> coin{0.0, 1.0};
  int64_t drafted = 0, accepted = 0, pad_rows = 0;
};

std::vector<int32_t> plain_output(std::vector<int32_t> prompt, int32_t n) {
  std::vector<int32_t> out;
  for (int32_t i = 0; i < n; ++i) {
    out.push_back(target_next(prompt));
    prompt.push_back(out.back());
  }
  return out;
}

class SpecSchedule : public ::testing::TestWithParam<int> {};  // page size

TEST_P(SpecSchedule, OutputsEqualPlainDecodingAndOnlyCommittedTokensAreCached) {
  const int32_t ps = GetParam();
  SchedulerConfig config{.page_size = ps,
                         .chunked_prefill_size = 8 * ps,
                         .max_running_requests = 16,
                         .clip_max_new_tokens = 2,
                         .decode_tokens_per_step = 5};
  // A pool that cannot hold everyone's output: retractions happen while drafts are verified.
  SpecFixture f(config, 120 / ps);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 12; ++i) {
    std::vector<int32_t> p;
    for (int j = 0; j < 5 + 3 * i; ++j) p.push_back(3 + (i * 11 + j * 5) % 20);
    prompts.push_back(p);
    f.submit(p, 30 + i);
  }
  const int32_t free_at_start = f.pool.num_free_pages();
  int64_t retractions = 0;
  for (int i = 0; i < 10000 && f.state.num_waiting() + f.state.num_running() > 0; ++i) {
    f.round(0.6);
  }
  ASSERT_EQ(f.state.num_waiting() + f.state.num_running(), 0u);
  for (const auto& r : f.requests) retractions += r->num_retractions();
  EXPECT_GT(f.accepted, 0);
  EXPECT_LT(f.accepted, f.drafted);  // some drafts were rejected (and rolled back)
  EXPECT_GT(retractions, 0) << "the pool was meant to force retraction";
  EXPECT_GT(f.pad_rows, 0) << "requests near their limit verify pad rows";
  // Token for token what plain decoding makes.
  for (size_t i = 0; i < prompts.size(); ++i)
    EXPECT_EQ(f.requests[i]->output_ids(), plain_output(prompts[i], 30 + int32_t(i))) << i;
  // Every page is free or cached, and the cache holds whole pages of committed tokens only: each
  // request's committed sequence matches its cached pages, and nothing else is cached.
  EXPECT_EQ(f.pool.num_free_pages() + f.cache.evictable_pages(), free_at_start);
  int64_t matched_pages = 0;
  for (const auto& r : f.requests) {
    const std::vector<int32_t> all = r->tokens(r->total_len());
    RadixMatch m = f.cache.match_prefix(all, /*record_stats=*/false);
    // Its KV covers all but the last token (finished at the length limit); the tight pool may
    // have evicted some of it since.
    EXPECT_LE(m.matched_tokens, (r->total_len() - 1) / ps * ps) << r->id();
    matched_pages += m.matched_tokens / ps;
  }
  EXPECT_EQ(matched_pages, f.cache.evictable_pages());  // the prompts share no page
}

INSTANTIATE_TEST_SUITE_P(PageSizes, SpecSchedule, ::testing::Values(1, 4));

TEST(SpecSchedule, DraftRoomStopsAtTheOutputLimitAndThePool) {
  SchedulerConfig config{.page_size = 4, .max_running_requests = 4, .decode_tokens_per_step = 6};
  SpecFixture f(config, 64);
  Request* r = f.submit({3, 4, 5}, 3);
  f.round(1.0);  // prefill: the first token
  ASSERT_EQ(r->state(), RequestState::kDecoding);
  EXPECT_EQ(f.state.draft_room(*r), 0);  // no room until a decision gives pages
  ScheduledStep step = f.state.schedule(f.scheduler);
  // 2 tokens remain: one draft and the target's own token at most.
  EXPECT_EQ(f.state.draft_room(*r), 1);
  EXPECT_EQ(step.num_decode_steps, 1);
}

TEST(SpecSchedule, ContinuousDecodeIsOneStepUnderSpeculation) {
  SchedulerConfig config{.page_size = 1,
                         .max_running_requests = 4,
                         .num_continuous_decode_steps = 8,
                         .decode_tokens_per_step = 4};
  SpecFixture f(config, 256);
  f.submit({3, 4, 5}, 40);
  f.round(1.0);
  ScheduledStep step = f.state.schedule(f.scheduler);
  EXPECT_EQ(step.num_decode_steps, 1);
  EXPECT_EQ(f.state.draft_room(*step.seqs[0].request), 3);
}

// --speculative-batch-size-threshold: a decision with more decodes than the threshold gives a
// plain step (not speculative, no draft room: the pages of one token each); at or below it,
// draft room again.
TEST(SpecSchedule, StepsAboveTheBatchSizeThresholdArePlain) {
  SchedulerConfig config{.page_size = 1,
                         .max_running_requests = 8,
                         .decode_tokens_per_step = 4,
                         .speculative_batch_size_threshold = 2};
  SpecFixture f(config, 256);
  f.submit({3, 4, 5}, 2);
  f.submit({6, 7}, 20);
  f.submit({8, 9, 10}, 20);
  f.round(1.0);  // prefill: each request's first token
  ASSERT_EQ(f.state.num_running(), 3u);
  ScheduledStep step = f.state.schedule(f.scheduler);
  ASSERT_EQ(step.seqs.size(), 3u);
  EXPECT_FALSE(step.speculative);
  std::vector<int32_t> sampled;
  for (const ScheduledSeq& s : step.seqs) {
    EXPECT_EQ(f.state.draft_room(*s.request), 0);
    EXPECT_EQ(int64_t(s.request->pages().size()), s.request->kv_len() + 1);
    sampled.push_back(target_next(s.request->tokens(s.request->total_len())));
  }
  EXPECT_EQ(f.state.complete(step, sampled).size(), 1u);  // the first request's second token
  step = f.state.schedule(f.scheduler);
  ASSERT_EQ(step.seqs.size(), 2u);
  EXPECT_TRUE(step.speculative);
  for (const ScheduledSeq& s : step.seqs) EXPECT_EQ(f.state.draft_room(*s.request), 3);
}

}  // namespace
}  // namespace strata
