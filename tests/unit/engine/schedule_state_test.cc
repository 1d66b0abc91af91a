// ScheduleState on scripted scenarios: retraction in a tiny pool, abort in every state, rejection.
#include "engine/schedule_state.h"

#include <gtest/gtest.h>

#include <memory>

namespace strata {
namespace {

struct Fixture {
  Fixture(SchedulerConfig config, int32_t num_pages)
      : pool(num_pages, config.page_size),
        cache(&pool),
        scheduler(config),
        state(config, &pool, &cache, {2}) {}

  Request* submit(std::vector<int32_t> prompt, int32_t max_new, bool ignore_eos = true) {
    SamplingParams p;
    p.max_new_tokens = max_new;
    p.ignore_eos = ignore_eos;
    requests.push_back(std::make_unique<Request>(int64_t(requests.size()), std::move(prompt), p));
    EXPECT_TRUE(state.submit(requests.back().get()).ok());
    return requests.back().get();
  }

  // Runs one decision (all its decode steps) with token 5 sampled everywhere.
  ScheduledStep round() {
    ScheduledStep first = state.schedule(scheduler);
    state.check_invariants();
    ScheduledStep step = first;
    for (int i = 0; i < first.num_decode_steps && !step.seqs.empty(); ++i) {
      if (i > 0) step = state.continue_decode();
      std::vector<int32_t> sampled;
      for (const ScheduledSeq& s : step.seqs)
        if (s.sample) sampled.push_back(5);
      BatchPlan::build(step.seqs, pool.page_size());  // CHECKs page tables cover the step
      state.complete(step, sampled);
      state.check_invariants();
    }
    return first;
  }

  void drain() {
    for (int i = 0; i < 10000 && state.num_waiting() + state.num_running() > 0; ++i) round();
    ASSERT_EQ(state.num_waiting() + state.num_running(), 0u);
  }

  PagePool pool;
  RadixCache cache;
  Scheduler scheduler;
  ScheduleState state;
  std::vector<std::unique_ptr<Request>> requests;
};

TEST(ScheduleState, RetractionHappensInATinyPoolAndEveryoneStillFinishes) {
  // A small decode reservation admits all four; their decode then outgrows the 24-token pool.
  Fixture f({.page_size = 1,
             .chunked_prefill_size = 0,
             .max_running_requests = 8,
             .clip_max_new_tokens = 2},
            24);
  for (int i = 0; i < 4; ++i) f.submit({7, 7, 7, int32_t(10 + i)}, 20);
  int retractions = 0, readmitted_with_hit = 0;
  for (int i = 0; i < 10000 && f.state.num_waiting() + f.state.num_running() > 0; ++i) {
    ScheduledStep step = f.round();
    retractions += int(step.retracted.size());
    for (const Request* r : step.retracted) {
      EXPECT_EQ(r->state(), RequestState::kRetracted);
      EXPECT_TRUE(r->pages().empty());
      EXPECT_EQ(f.state.waiting().front()->state(), RequestState::kRetracted);
    }
    for (const ScheduledSeq& s : step.seqs) {
      const Request* r = s.request;
      if (step.is_prefill && r->num_retractions() > 0)
        readmitted_with_hit += r->prefix_hit_tokens() > 0;
    }
    if (!step.retracted.empty()) {
      EXPECT_GT(f.state.new_token_ratio(), 0.7);
    }
  }
  EXPECT_GT(retractions, 0);
  EXPECT_GT(readmitted_with_hit, 0);  // re-prefill reuses the shared, still-cached prefix
  for (auto& r : f.requests) {
    EXPECT_EQ(r->state(), RequestState::kFinished);
    EXPECT_EQ(r->finish_reason(), FinishReason::kLength);
    EXPECT_EQ(r->output_len(), 20);  // a retraction keeps the tokens already generated
  }
  EXPECT_TRUE(f.state.flush_cache());
  EXPECT_EQ(f.pool.num_free_pages(), 24);
}

// --disable-radix-cache: the same prompt again (and a retraction) finds nothing cached, chunked
// prefill and retraction still work, and every page is free once the requests end.
TEST(ScheduleState, WithoutTheRadixCacheNothingIsSharedOrKept) {
  for (const bool disable : {false, true}) {
    SCOPED_TRACE(disable ? "disabled" : "enabled");
    Fixture f({.page_size = 2,
               .chunked_prefill_size = 4,
               .max_running_requests = 8,
               .clip_max_new_tokens = 2,
               .disable_radix_cache = disable},
              24);
    const std::vector<int32_t> prompt = {7, 8, 9, 10, 11, 12, 13, 14, 15};
    Request* first = f.submit(prompt, 3);
    f.drain();
    Request* again = f.submit(prompt, 3);
    f.drain();
    EXPECT_EQ(first->prefix_hit_tokens(), 0);
    EXPECT_EQ(again->prefix_hit_tokens(), disable ? 0 : 8);
    EXPECT_EQ(f.cache.cached_pages(),
              disable ? 0 : 5);  // 9 prompt + 3 output tokens, minus the last
    // Four at once outgrow the pool: retracted requests come back and finish.
    for (int i = 0; i < 4; ++i) f.submit({3, 3, 3, 3, int32_t(20 + i)}, 16);
    f.drain();
    int retractions = 0;
    for (size_t i = 2; i < f.requests.size(); ++i) {
      EXPECT_EQ(f.requests[i]->output_len(), 16);
      retractions += f.requests[i]->num_retractions();
      if (disable) {
        EXPECT_EQ(f.requests[i]->prefix_hit_tokens(), 0);
      }
    }
    EXPECT_GT(retractions, 0);
    if (disable) {
      EXPECT_EQ(f.pool.num_free_pages(), 24);
    }
  }
}

// A capture request computes every position (GenerateRequest::use_prefix_cache = false) while its
// pages still go to the cache; its one-token tail request is urgent (queued first) and shares them.
TEST(ScheduleState, NoPrefixCacheRequestsComputeEverythingAndUrgentOnesQueueFirst) {
  Fixture f({.page_size = 2,
             .chunked_prefill_size = 4,
             .max_running_requests = 8,
             .clip_max_new_tokens = 2},
            32);
  const std::vector<int32_t> prompt = {7, 8, 9, 10, 11, 12, 13, 14, 15};
  f.submit(prompt, 3);
  f.drain();
  SamplingParams p;
  p.max_new_tokens = 1;
  Request uncached(100, prompt, p), tail(101, prompt, p);
  uncached.set_use_prefix_cache(false);
  tail.set_urgent(true);
  Request* normal = f.submit({1, 2, 3}, 2);
  ASSERT_TRUE(f.state.submit(&uncached).ok());
  ASSERT_TRUE(f.state.submit(&tail).ok());
  ASSERT_EQ(f.state.waiting().front(), &tail);
  EXPECT_EQ(f.state.waiting().back(), &uncached);
  // The decision sees no hit for the request that shares none (it would count pages admission
  // then has to allocate: "the decision over-committed the pool").
  for (const WaitingEntry& w : f.state.snapshot().waiting)
    EXPECT_EQ(w.cached_tokens, w.id == uncached.id() ? 0 : w.id == tail.id() ? 8 : 0) << w.id;
  f.drain();
  EXPECT_EQ(uncached.prefix_hit_tokens(), 0);
  EXPECT_EQ(tail.prefix_hit_tokens(), 8);
  EXPECT_EQ(normal->output_len(), 2);
}

TEST(ScheduleState, NeverFittingPromptIsRejectedNotRetried) {
  Fixture f({.page_size = 4}, 4);  // 16 tokens
  Request* big = f.submit(std::vector<int32_t>(16, 3), 4);
  Request* ok = f.submit(std::vector<int32_t>(15, 3), 4);
  EXPECT_EQ(ok->max_new_tokens(), 1);  // clamped so that prompt + output fits the pool
  ScheduledStep step = f.round();
  ASSERT_EQ(step.rejected.size(), 1u);
  EXPECT_EQ(step.rejected[0], big);
  EXPECT_EQ(big->state(), RequestState::kAborted);
  EXPECT_NE(big->error().find("can never fit"), std::string::npos);
  f.drain();
  EXPECT_EQ(ok->state(), RequestState::kFinished);
  EXPECT_EQ(ok->output_len(), 1);
}

TEST(ScheduleState, EmptyPromptIsAnError) {
  Fixture f({.page_size = 1}, 8);
  Request r(1, {}, SamplingParams{});
  EXPECT_FALSE(f.state.submit(&r).ok());
  EXPECT_EQ(r.state(), RequestState::kAborted);
}

TEST(ScheduleState, AbortInEveryStateFreesAllPages) {
  Fixture f({.page_size = 2, .chunked_prefill_size = 4, .max_running_requests = 8}, 32);
  Request* waiting = f.submit({1, 2, 3}, 4);
  f.state.abort(waiting);
  EXPECT_EQ(waiting->state(), RequestState::kAborted);
  EXPECT_EQ(f.state.num_waiting(), 0u);

  Request* chunked = f.submit({1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 4);
  f.round();
  ASSERT_EQ(chunked->state(), RequestState::kPrefilling);
  ASSERT_EQ(chunked->kv_len(), 4);
  f.state.abort(chunked);
  f.state.check_invariants();
  EXPECT_TRUE(chunked->pages().empty());

  Request* decoding = f.submit({1, 2, 3, 4, 5}, 8);
  f.round();
  ASSERT_EQ(decoding->state(), RequestState::kDecoding);
  EXPECT_EQ(decoding->prefix_hit_tokens(), 4);  // the aborted chunk's full pages were cached
  f.state.abort(decoding);
  f.state.check_invariants();

  // Aborted between planning a step and completing it: the step's result is dropped.
  Request* in_flight = f.submit({4, 4, 4}, 8);
  ScheduledStep step = f.state.schedule(f.scheduler);
  f.state.abort(in_flight);
  f.state.complete(step, std::vector<int32_t>{5});
  f.state.check_invariants();
  EXPECT_EQ(in_flight->output_len(), 0);

  EXPECT_EQ(f.state.num_running(), 0u);
  EXPECT_TRUE(f.state.flush_cache());
  EXPECT_EQ(f.pool.num_free_pages(), 32);
}

TEST(ScheduleState, AbortARetractedRequest) {
  Fixture f({.page_size = 1, .chunked_prefill_size = 0, .clip_max_new_tokens = 1}, 12);
  for (int i = 0; i < 3; ++i) f.submit({int32_t(10 + i), 1, 1}, 9);
  Request* retracted = nullptr;
  for (int i = 0; i < 100 && retracted == nullptr; ++i) {
    ScheduledStep step = f.round();
    if (!step.retracted.empty()) retracted = step.retracted[0];
  }
  ASSERT_NE(retracted, nullptr);
  f.state.abort(retracted);
  f.state.check_invariants();
  EXPECT_EQ(retracted->state(), RequestState::kAborted);
  f.drain();
  EXPECT_TRUE(f.state.flush_cache());
  EXPECT_EQ(f.pool.num_free_pages(), 12);
}

TEST(ScheduleState, StopTokenAndEosFinishUnlessIgnored) {
  Fixture f({.page_size = 1}, 64);
  Request* eos = f.submit({1, 2}, 10, /*ignore_eos=*/false);
  Request* ignoring = f.submit({1, 3}, 3, /*ignore_eos=*/true);
  ScheduledStep step = f.state.schedule(f.scheduler);
  ASSERT_EQ(step.seqs.size(), 2u);
  auto finished = f.state.complete(step, std::vector<int32_t>{2, 2});  // EOS for both
  ASSERT_EQ(finished.size(), 1u);
  EXPECT_EQ(finished[0], eos);
  EXPECT_EQ(eos->finish_reason(), FinishReason::kStop);
  EXPECT_EQ(ignoring->state(), RequestState::kDecoding);
  f.drain();
  EXPECT_EQ(ignoring->finish_reason(), FinishReason::kLength);
  EXPECT_EQ(ignoring->output_len(), 3);
}

TEST(RequestDeathTest, IllegalTransitionsAbort) {
  Request r(1, {1, 2}, SamplingParams{});
  EXPECT_DEATH(r.start_decode(), "start_decode from waiting");
  EXPECT_DEATH(r.finish(FinishReason::kStop), "finish from waiting");
  r.abort();
  EXPECT_DEATH(r.start_prefill(), "start_prefill from aborted");
  EXPECT_DEATH(r.abort(), "abort from aborted");
}

}  // namespace
}  // namespace strata
