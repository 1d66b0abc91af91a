// An abort during a long chunked prefill stops the work at the next chunk boundary: the tokens
// computed for the request (counted in aborted_computed_tokens_total) exceed what had been
// scheduled when the abort arrived by at most the step in flight plus one chunk, far short of
// the prompt. The admission event comes before any token.
#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <thread>

#include "engine/engine.h"

namespace strata {
namespace {

TEST(EngineAbort, LongPrefillStopsWithinAChunk) {
  constexpr int kChunk = 128, kPromptTokens = 3000;
  EngineConfig c;
  c.model_path = std::string(STRATA_SHARED_DIR) + "/models/house-llama";
  c.chunked_prefill_size = kChunk;
  c.max_prefill_tokens = kChunk;
  auto engine = Engine::create(c);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  Engine& e = **engine;
  std::mt19937 rng(7);
  GenerateRequest g;
  for (int i = 0; i < kPromptTokens; ++i) g.prompt_ids.push_back(int32_t(100 + rng() % 4000));
  g.params.max_new_tokens = 4;
  std::atomic<bool> started{false}, finished{false}, token_before_start{false};
  std::atomic<int> reason{-1};
  g.on_event = [&](const StreamEvent& ev) {
    if (ev.started) started = true;
    if (!ev.token_ids.empty() && !started) token_before_start = true;
    if (ev.finished) {
      reason = int(ev.finish_reason);
      finished = true;
    }
  };
  auto id = e.submit(std::move(g));
  ASSERT_TRUE(id.ok());
  // Some chunks in: then the client goes away.
  while (e.stats().prefill_tokens_total < 3 * kChunk) std::this_thread::yield();
  const int64_t scheduled_at_abort = e.stats().prefill_tokens_total;
  e.abort(*id);
  e.wait_idle();
  ASSERT_TRUE(finished);
  EXPECT_TRUE(started);
  EXPECT_FALSE(token_before_start);
  EXPECT_EQ(reason, int(FinishReason::kAbort));
  const EngineStats s = e.stats();
  std::printf(
      "prefill scheduled when the abort arrived: %lld tokens; computed for the aborted request: "
      "%lld "
      "(prompt %d, chunk %d)\n",
      (long long)scheduled_at_abort, (long long)s.aborted_computed_tokens_total, kPromptTokens,
      kChunk);
  // Stats lag the engine by at most the step in flight; the abort lands before the next one.
  EXPECT_GE(s.aborted_computed_tokens_total, 3 * kChunk);
  EXPECT_LE(s.aborted_computed_tokens_total, scheduled_at_abort + 2 * kChunk);
  EXPECT_EQ(s.prefill_tokens_total, s.aborted_computed_tokens_total)
      << "prefill went on after the abort";
  EXPECT_EQ(s.num_running, 0);
  EXPECT_EQ(s.kv_tokens_used, s.kv_tokens_cached);
}

// /metrics reads EngineStats: a step's batch is published before its forward pass (a long prefill
// shows as running while it runs), and an internal request (the health probe) is no traffic.
TEST(EngineStatsLive, BatchIsPublishedBeforeTheForwardAndProbesAreNotCounted) {
  EngineConfig c;
  c.model_path = std::string(STRATA_SHARED_DIR) + "/models/house-llama";
  c.chunked_prefill_size = 2048;
  c.max_prefill_tokens = 2048;
  auto engine = Engine::create(c);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  Engine& e = **engine;
  GenerateRequest probe;
  probe.prompt_ids = {5, 6, 7};
  probe.params.max_new_tokens = 1;
  probe.internal = true;
  ASSERT_TRUE(e.submit(std::move(probe)).ok());
  e.wait_idle();
  EngineStats s = e.stats();
  EXPECT_EQ(s.requests_finished_total, 0);
  EXPECT_EQ(s.generation_tokens_total, 0);
  EXPECT_EQ(s.prompt_tokens_total, 0);
  EXPECT_EQ(s.steps_total, 1);

  std::atomic<bool> started{false};
  GenerateRequest g;
  for (int i = 0; i < 1500; ++i) g.prompt_ids.push_back(int32_t(100 + i % 4000));
  g.params.max_new_tokens = 2;
  g.on_event = [&](const StreamEvent& ev) { started = started || ev.started; };
  auto id = e.submit(std::move(g));
  ASSERT_TRUE(id.ok());
  while (!started) std::this_thread::yield();
  s = e.stats();  // the 1,500-token prefill step is running now
  EXPECT_EQ(s.num_running, 1);
  EXPECT_EQ(s.steps_total, 1) << "the step had finished already: the check proves nothing";
  EXPECT_GT(s.kv_tokens_used, 1000);
  e.abort(*id);
  e.wait_idle();
  EXPECT_GT(e.stats().last_step_seconds, 0);
  EXPECT_GE(e.stats().longest_recent_step_seconds, e.stats().last_step_seconds);
}

}  // namespace
}  // namespace strata
