// Engine acceptance on the real house models: batch invariance (concurrent == alone), also under
// a pool so small that requests are retracted; prefix-cache reuse; abort frees every page.
#include <gtest/gtest.h>

#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "support/engine_greedy.h"
#include "support/heldout_prompts.h"

namespace strata {
namespace {

const std::string kShared = STRATA_SHARED_DIR;

std::vector<std::vector<int32_t>> make_prompts(const Tokenizer& tok, int count) {
  return testing::heldout_token_prompts(tok, count);
}

struct Outputs {
  std::vector<std::vector<int32_t>> tokens;
  EngineStats stats;
};

Outputs run_all(Engine& engine, const std::vector<std::vector<int32_t>>& prompts, int new_tokens) {
  Outputs out;
  out.tokens = testing::greedy_tokens(engine, prompts, new_tokens);
  out.stats = engine.stats();
  return out;
}

std::unique_ptr<Engine> make_engine(const std::string& model, std::optional<int> max_running,
                                    std::optional<int64_t> max_total_tokens, int page_size = 4,
                                    double conservativeness = 1.0) {
  EngineConfig c;
  c.schedule_conservativeness = conservativeness;
  c.model_path = kShared + "/models/" + model;
  c.page_size = page_size;
  c.max_running_requests = max_running;
  c.max_total_tokens = max_total_tokens;
  c.chunked_prefill_size = 64;  // long prompts are split: chunked prefill is exercised
  auto e = Engine::create(c);
  EXPECT_TRUE(e.ok()) << e.status().to_string();
  return e.ok() ? std::move(e).value() : nullptr;
}

class BatchInvariance : public ::testing::TestWithParam<std::string> {};

TEST_P(BatchInvariance, ConcurrentEqualsAloneAlsoWithRetraction) {
  const int kNew = 8;
  auto alone_engine = make_engine(GetParam(), 1, std::nullopt);
  ASSERT_TRUE(alone_engine);
  auto prompts = make_prompts(alone_engine->tokenizer(), 64);
  ASSERT_EQ(prompts.size(), 64u);
  Outputs alone = run_all(*alone_engine, prompts, kNew);
  alone_engine.reset();

  auto batched_engine = make_engine(GetParam(), std::nullopt, std::nullopt);
  Outputs batched = run_all(*batched_engine, prompts, kNew);
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_EQ(alone.tokens[i].size(), size_t(kNew)) << i;
    EXPECT_EQ(batched.tokens[i], alone.tokens[i]) << "prompt " << i << " differs when batched";
  }
  EXPECT_EQ(batched.stats.retractions_total, 0);

  // A pool of 640 tokens cannot hold 64 requests of up to ~110 tokens, and an optimistic decode
  // reservation over-admits: decode runs out of pages and requests are retracted, then resume by
  // re-prefilling.
  auto tight_engine = make_engine(GetParam(), std::nullopt, 640, 4, 0.02);
  Outputs tight = run_all(*tight_engine, prompts, kNew);
  EXPECT_GT(tight.stats.retractions_total, 0) << "the small pool was meant to force retraction";
  for (size_t i = 0; i < prompts.size(); ++i)
    EXPECT_EQ(tight.tokens[i], alone.tokens[i]) << "prompt " << i << " differs under retraction";
  // Everything finished: only the prefix cache holds pages.
  EXPECT_EQ(tight.stats.num_running, 0);
  EXPECT_EQ(tight.stats.kv_tokens_used, tight.stats.kv_tokens_cached);
}

INSTANTIATE_TEST_SUITE_P(HouseModels, BatchInvariance,
                         ::testing::Values("house-llama", "house-mla"), [](const auto& info) {
                           return info.param == "house-llama" ? "llama" : "mla";
                         });

TEST(PrefixCache, SharedPrefixReusesPagesAndKeepsOutputs) {
  auto engine = make_engine("house-llama", std::nullopt, std::nullopt);
  ASSERT_TRUE(engine);
  auto base = make_prompts(engine->tokenizer(), 2)[1];  // 41 tokens
  auto long_prefix = engine->tokenizer().encode(
      "The harbor was quiet in the early morning, and the fishing boats rocked gently against "
      "the old wooden pier while gulls circled overhead looking for scraps of the night's catch.");
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 8; ++i) {
    auto p = long_prefix;
    p.insert(p.end(), base.begin(), base.begin() + 1 + i);
    prompts.push_back(p);
  }
  // Reference: each prompt alone on a fresh engine (no cache to hit).
  std::vector<std::vector<int32_t>> expected;
  for (const auto& p : prompts) {
    auto fresh = make_engine("house-llama", std::nullopt, std::nullopt);
    expected.push_back(run_all(*fresh, {p}, 8).tokens[0]);
  }
  Outputs first = run_all(*engine, {prompts[0]}, 8);
  const int64_t hits_before = engine->stats().cache_hit_tokens_total;
  Outputs rest = run_all(*engine, {prompts.begin() + 1, prompts.end()}, 8);
  const int64_t hits = rest.stats.cache_hit_tokens_total - hits_before;
  // Every later prompt finds at least the whole pages of the shared prefix.
  const int64_t prefix_pages_tokens = int64_t(long_prefix.size()) / 4 * 4;
  EXPECT_GE(hits, 7 * prefix_pages_tokens);
  EXPECT_EQ(first.tokens[0], expected[0]);
  for (size_t i = 1; i < prompts.size(); ++i) EXPECT_EQ(rest.tokens[i - 1], expected[i]) << i;
}

TEST(Abort, FreesAllPagesInEveryState) {
  auto engine = make_engine("house-llama", std::nullopt, std::nullopt);
  ASSERT_TRUE(engine);
  ASSERT_TRUE(engine->flush_cache());
  auto prompts = make_prompts(engine->tokenizer(), 16);
  std::vector<int64_t> ids;
  std::mutex mu;
  int aborted = 0;
  for (const auto& p : prompts) {
    GenerateRequest g;
    g.prompt_ids = p;
    g.params.temperature = 0;
    g.params.max_new_tokens = 400;
    g.params.ignore_eos = true;
    g.on_event = [&](const StreamEvent& ev) {
      if (ev.finished) {
        std::lock_guard<std::mutex> lk(mu);
        aborted += ev.finish_reason == FinishReason::kAbort;
      }
    };
    ids.push_back(*engine->submit(std::move(g)));
  }
  // Abort immediately (waiting), and the rest once tokens flow (prefilling or decoding).
  for (size_t i = 0; i < ids.size(); i += 2) engine->abort(ids[i]);
  while (engine->stats().generation_tokens_total < 40) std::this_thread::yield();
  for (size_t i = 1; i < ids.size(); i += 2) engine->abort(ids[i]);
  engine->wait_idle();
  EXPECT_EQ(aborted, 16);
  auto s = engine->stats();
  EXPECT_EQ(s.num_running, 0);
  EXPECT_EQ(s.kv_tokens_used, s.kv_tokens_cached) << "aborted requests left pages behind";
  EXPECT_TRUE(engine->flush_cache());
  EXPECT_EQ(engine->stats().kv_tokens_used, 0);
}

}  // namespace
}  // namespace strata
