// Scheduler::decide on hand-made snapshots: each test states the policy rule it checks.
#include "engine/scheduler.h"

#include <gtest/gtest.h>

namespace strata {
namespace {

SchedulerConfig small_config() {
  return SchedulerConfig{.page_size = 1,
                         .chunked_prefill_size = 64,
                         .max_prefill_tokens = 128,
                         .max_running_requests = 4,
                         .num_continuous_decode_steps = 1};
}

SchedulerSnapshot pool(int32_t total, int32_t free, int32_t evictable = 0) {
  return SchedulerSnapshot{.total_pages = total, .free_pages = free, .evictable_pages = evictable};
}

RunningEntry decoding(int64_t id, int32_t kv_len, int32_t output_len, int32_t prompt_len,
                      int32_t remaining, int32_t page_size = 1) {
  return RunningEntry{.id = id,
                      .decoding = true,
                      .kv_len = kv_len,
                      .total_len = kv_len + 1,
                      .held_pages = (kv_len + page_size - 1) / page_size,
                      .prompt_len = prompt_len,
                      .output_len = output_len,
                      .remaining_new_tokens = remaining,
                      .max_new_tokens = output_len + remaining,
                      .releasable_pages = (kv_len + page_size - 1) / page_size};
}

TEST(Scheduler, AdmitsWhenPromptPlusReservationFits) {
  Scheduler sched(small_config());
  SchedulerSnapshot s = pool(100, 100);
  s.waiting = {{.id = 1, .total_len = 50, .remaining_new_tokens = 40},   // 90 of 100
               {.id = 2, .total_len = 20, .remaining_new_tokens = 40}};  // 150 > 100: waits
  Decision d = sched.decide(s);
  ASSERT_EQ(d.prefill.size(), 1u);
  EXPECT_EQ(d.prefill[0].id, 1);
  EXPECT_EQ(d.prefill[0].num_tokens, 50);
  EXPECT_TRUE(d.prefill[0].last_chunk);
  EXPECT_TRUE(d.decode.empty());  // prefill steps do not decode
}

TEST(Scheduler, CachedPrefixIsNotChargedButLockingItIs) {
  Scheduler sched(small_config());
  SchedulerSnapshot s = pool(100, 40, 20);  // 60 obtainable
  // 50 tokens of which 30 cached (all 30 evictable now): 20 new + 10 reserve + 30 locked = 60.
  s.waiting = {{.id = 1,
                .total_len = 50,
                .cached_tokens = 30,
                .cached_evictable_pages = 30,
                .remaining_new_tokens = 10}};
  Decision d = sched.decide(s);
  ASSERT_EQ(d.prefill.size(), 1u);
  EXPECT_EQ(d.prefill[0].num_tokens, 20);
  s.waiting[0].remaining_new_tokens = 11;  // one token more than the pool can promise
  s.running = {decoding(9, 5, 1, 4, 0)};   // not idle, so no relaxation
  EXPECT_TRUE(sched.decide(s).prefill.empty());
}

TEST(Scheduler, RunningReservationScalesWithNewTokenRatio) {
  Scheduler sched(small_config());
  SchedulerSnapshot s = pool(1000, 300);
  s.running = {decoding(1, 10, 1, 9, 400)};  // reserves 400 x ratio
  s.waiting = {{.id = 2, .total_len = 50, .remaining_new_tokens = 10}};
  s.new_token_ratio = 0.7;  // 280 reserved: 300 - 280 < 60
  EXPECT_TRUE(sched.decide(s).prefill.empty());
  s.new_token_ratio = 0.5;  // 200 reserved: 100 left >= 60
  EXPECT_EQ(sched.decide(s).prefill.size(), 1u);
}

TEST(Scheduler, ReservationIsClipped) {
  SchedulerConfig c = small_config();
  c.clip_max_new_tokens = 16;
  Scheduler sched(c);
  SchedulerSnapshot s = pool(100, 60);
  s.running = {decoding(1, 10, 1, 9, 100000)};  // reserves 16 x 0.7, not 70000
  s.waiting = {{.id = 2, .total_len = 20, .remaining_new_tokens = 100000}};  // 20 + 16
  EXPECT_EQ(sched.decide(s).prefill.size(), 1u);
}

TEST(Scheduler, IdlePoolAdmitsHeadEvenWithoutRoomForTheReservation) {
  Scheduler sched(small_config());
  SchedulerSnapshot s = pool(100, 100);
  s.waiting = {{.id = 1, .total_len = 60, .remaining_new_tokens = 40}};  // 60 + 40 > 100... no:
  s.waiting[0].remaining_new_tokens = 41;                                // 101 > 100
  Decision d = sched.decide(s);
  ASSERT_EQ(d.prefill.size(), 1u);
  EXPECT_TRUE(d.reject.empty());
}

TEST(Scheduler, RejectsPromptThatCanNeverFit) {
  Scheduler sched(small_config());
  SchedulerSnapshot s = pool(100, 100);
  s.waiting = {{.id = 1, .total_len = 100, .remaining_new_tokens = 1},  // 100 + 1 > 100
               {.id = 2, .total_len = 99, .remaining_new_tokens = 1}};  // fits exactly
  Decision d = sched.decide(s);
  EXPECT_EQ(d.reject, std::vector<int64_t>{1});
  ASSERT_EQ(d.prefill.size(), 1u);
  EXPECT_EQ(d.prefill[0].id, 2);

  SchedulerConfig c = small_config();
  c.page_size = 16;
  Scheduler paged(c);
  SchedulerSnapshot p = pool(4, 4);  // 64 tokens
  p.waiting = {{.id = 3, .total_len = 64, .remaining_new_tokens = 1}};
  EXPECT_EQ(paged.decide(p).reject, std::vector<int64_t>{3});
}

TEST(Scheduler, ChunksLongPromptsOneChunkedRequestAtATime) {
  SchedulerConfig c = small_config();  // chunk 64
  c.max_prefill_tokens = 1000;
  Scheduler sched(c);
  SchedulerSnapshot s = pool(1000, 1000);
  s.waiting = {{.id = 1, .total_len = 150, .remaining_new_tokens = 8},
               {.id = 2, .total_len = 150, .remaining_new_tokens = 8}};
  Decision d = sched.decide(s);
  ASSERT_EQ(d.prefill.size(), 1u);
  EXPECT_EQ(d.prefill[0].num_tokens, 64);
  EXPECT_FALSE(d.prefill[0].last_chunk);

  // Next step: the chunked request continues first; nobody is admitted until its last chunk.
  s.running = {RunningEntry{.id = 1,
                            .decoding = false,
                            .kv_len = 64,
                            .total_len = 150,
                            .held_pages = 64,
                            .prompt_len = 150,
                            .remaining_new_tokens = 8,
                            .max_new_tokens = 8}};
  s.waiting.erase(s.waiting.begin());
  d = sched.decide(s);
  ASSERT_EQ(d.prefill.size(), 1u);
  EXPECT_EQ(d.prefill[0].id, 1);
  EXPECT_EQ(d.prefill[0].num_tokens, 64);
  EXPECT_FALSE(d.prefill[0].last_chunk);

  // Last chunk (22 tokens) leaves 42 tokens of chunk budget: request 2 starts chunked with 42.
  s.running[0].kv_len = 128;
  s.running[0].held_pages = 128;
  d = sched.decide(s);
  ASSERT_EQ(d.prefill.size(), 2u);
  EXPECT_EQ(d.prefill[0].num_tokens, 22);
  EXPECT_TRUE(d.prefill[0].last_chunk);
  EXPECT_EQ(d.prefill[1].id, 2);
  EXPECT_EQ(d.prefill[1].num_tokens, 42);
  EXPECT_FALSE(d.prefill[1].last_chunk);
}

// Prompt-scoring requests (a full logits row a token) share score_rows_per_step tokens a step,
// whatever the chunk size; the others keep the whole chunk.
TEST(Scheduler, PromptScoringRequestsShareTheScoreRowsOfAStep) {
  SchedulerConfig c = small_config();  // chunk 64
  c.page_size = 4;
  c.max_prefill_tokens = 1000;
  c.score_rows_per_step = 30;  // 28: whole pages
  Scheduler sched(c);
  SchedulerSnapshot s = pool(1000, 1000);
  s.waiting = {{.id = 1, .total_len = 20, .remaining_new_tokens = 4, .scores_prompt = true},
               {.id = 2, .total_len = 20, .remaining_new_tokens = 4, .scores_prompt = true},
               {.id = 3, .total_len = 20, .remaining_new_tokens = 4}};
  Decision d = sched.decide(s);
  // 1 whole (20 of 28), then 2 chunked to the 8 left; 3 waits behind the chunked request.
  ASSERT_EQ(d.prefill.size(), 2u);
  EXPECT_EQ(d.prefill[0].num_tokens, 20);
  EXPECT_TRUE(d.prefill[0].last_chunk);
  EXPECT_EQ(d.prefill[1].id, 2);
  EXPECT_EQ(d.prefill[1].num_tokens, 8);
  EXPECT_FALSE(d.prefill[1].last_chunk);

  // Next step: 2 continues within 28 (12 left of it), then 3 (not scoring) takes what the chunk
  // has left.
  s.waiting.erase(s.waiting.begin(), s.waiting.begin() + 2);
  s.running = {RunningEntry{.id = 2,
                            .decoding = false,
                            .kv_len = 8,
                            .total_len = 20,
                            .held_pages = 2,
                            .prompt_len = 20,
                            .remaining_new_tokens = 4,
                            .max_new_tokens = 4,
                            .scores_prompt = true}};
  s.waiting[0].total_len = 60;
  d = sched.decide(s);
  ASSERT_EQ(d.prefill.size(), 2u);
  EXPECT_EQ(d.prefill[0].num_tokens, 12);
  EXPECT_TRUE(d.prefill[0].last_chunk);
  EXPECT_EQ(d.prefill[1].id, 3);
  EXPECT_EQ(d.prefill[1].num_tokens, 52);  // 64 - 12: the chunk budget, not the score rows

  // A long scoring prompt alone: chunks of 28 though the chunk allows 64.
  s.running.clear();
  s.waiting = {{.id = 4, .total_len = 100, .remaining_new_tokens = 4, .scores_prompt = true}};
  d = sched.decide(s);
  ASSERT_EQ(d.prefill.size(), 1u);
  EXPECT_EQ(d.prefill[0].num_tokens, 28);
  EXPECT_FALSE(d.prefill[0].last_chunk);
}

TEST(Scheduler, NonFinalChunksEndOnPageBoundaries) {
  SchedulerConfig c = small_config();
  c.page_size = 16;
  c.chunked_prefill_size = 40;  // rounds down to 32
  Scheduler sched(c);
  SchedulerSnapshot s = pool(100, 100);
  s.waiting = {{.id = 1, .total_len = 100, .cached_tokens = 16, .remaining_new_tokens = 4}};
  Decision d = sched.decide(s);
  ASSERT_EQ(d.prefill.size(), 1u);
  EXPECT_EQ(d.prefill[0].num_tokens, 32);  // kv 16 -> 48, a page boundary
}

TEST(Scheduler, RespectsMaxRunningAndMaxPrefillTokens) {
  SchedulerConfig c = small_config();
  c.max_running_requests = 2;
  Scheduler sched(c);
  SchedulerSnapshot s = pool(10000, 10000);
  for (int i = 0; i < 5; ++i)
    s.waiting.push_back({.id = i, .total_len = 10, .remaining_new_tokens = 5});
  EXPECT_EQ(sched.decide(s).prefill.size(), 2u);

  c.max_running_requests = 100;
  c.max_prefill_tokens = 25;
  Scheduler limited(c);
  EXPECT_EQ(limited.decide(s).prefill.size(), 2u);  // 10 + 10; a third would pass 25
}

TEST(Scheduler, DecodesAllAndRunsContinuousStepsOnlyWithoutPrefillWork) {
  SchedulerConfig c = small_config();
  c.num_continuous_decode_steps = 4;
  Scheduler sched(c);
  SchedulerSnapshot s = pool(100, 50);
  s.running = {decoding(1, 10, 2, 8, 10), decoding(2, 20, 5, 15, 10)};
  Decision d = sched.decide(s);
  EXPECT_EQ(d.decode, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(d.num_decode_steps, 4);
  EXPECT_NEAR(d.new_token_ratio, 0.7 - 0.001, 1e-12);  // decays per decode step

  s.waiting = {{.id = 3, .total_len = 1000 - 1, .remaining_new_tokens = 1}};  // waits (no room)
  s.total_pages = 1000;
  d = sched.decide(s);
  EXPECT_TRUE(d.prefill.empty());
  EXPECT_EQ(d.num_decode_steps, 1);

  s.waiting.clear();
  s.free_pages = 5;  // 4 steps need 8 pages, 2 steps need 4
  EXPECT_EQ(sched.decide(s).num_decode_steps, 2);
}

TEST(Scheduler, RatioFloorsAtMinAndResetsWhenIdle) {
  Scheduler sched(small_config());
  SchedulerSnapshot s = pool(100, 50);
  s.running = {decoding(1, 10, 2, 8, 10)};
  s.new_token_ratio = 0.1005;
  EXPECT_DOUBLE_EQ(sched.decide(s).new_token_ratio, 0.1);
  s.running.clear();
  EXPECT_DOUBLE_EQ(sched.decide(s).new_token_ratio, 0.7);
}

TEST(Scheduler, RetractsLeastProgressWhenDecodeRunsOutOfPages) {
  Scheduler sched(small_config());
  SchedulerSnapshot s = pool(100, 0);        // three decoders need three pages
  s.running = {decoding(1, 30, 10, 20, 50),  // most output: kept
               decoding(2, 33, 3, 30, 50),   // fewest output, shorter prompt
               decoding(3, 43, 3, 40, 50)};  // fewest output, longest prompt: retracted first
  s.running[2].releasable_pages = 1;  // (shares most of its pages) frees one: two still short
  s.new_token_ratio = 0.2;
  Decision d = sched.decide(s);
  EXPECT_EQ(d.retract, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(d.decode, std::vector<int64_t>{1});
  EXPECT_EQ(d.num_decode_steps, 1);
  // Raised to the survivors' observed need: (10 + 20 x 1) / (60 + 1).
  EXPECT_NEAR(d.new_token_ratio, 30.0 / 61.0, 1e-12);
  EXPECT_TRUE(d.prefill.empty());

  s.running[2].releasable_pages = 43;  // now one retraction is enough
  d = sched.decide(s);
  EXPECT_EQ(d.retract, std::vector<int64_t>{3});
}

TEST(Scheduler, PagedDecodeNeedsPagesOnlyAtPageBoundaries) {
  SchedulerConfig c = small_config();
  c.page_size = 4;
  Scheduler sched(c);
  SchedulerSnapshot s = pool(100, 0);
  s.running = {decoding(1, 6, 1, 5, 10, 4), decoding(2, 7, 1, 6, 10, 4)};  // room in last page
  Decision d = sched.decide(s);
  EXPECT_TRUE(d.retract.empty());
  EXPECT_EQ(d.decode.size(), 2u);
  s.running[1].kv_len = 8;  // page full: needs a new one, none free
  s.running[1].held_pages = 2;
  d = sched.decide(s);
  EXPECT_EQ(d.retract.size(), 1u);
}

TEST(Scheduler, LoneRequestThatCannotGrowIsTruncatedNotRetried) {
  Scheduler sched(small_config());
  SchedulerSnapshot s = pool(10, 0);
  s.running = {decoding(1, 10, 5, 5, 3)};
  Decision d = sched.decide(s);
  EXPECT_TRUE(d.retract.empty());
  EXPECT_EQ(d.truncate, std::vector<int64_t>{1});
  EXPECT_TRUE(d.decode.empty());
}

}  // namespace
}  // namespace strata
