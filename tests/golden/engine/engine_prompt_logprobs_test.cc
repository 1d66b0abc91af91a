// Prompt logprobs (GenerateRequest::prompt_logprobs_from: OpenAI's echo with logprobs, SGLang's
// logprob_start_len) through the whole engine on house-llama (CPU reference), against the Hugging
// Face logits of every position in ../shared/fixtures/house-llama: the logprob of each prompt token
// given the tokens before it, and its top alternatives, with the prompt prefilled in chunks of 8
// (so scored rows span several steps and meet the sampled row in the last), in a batch, from a
// start position, and with the prompt's prefix already in the prefix cache.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <mutex>

#include "engine/engine.h"
#include "support/golden.h"

namespace strata {
namespace {

using testing::log_softmax;
using testing::Reference;
using testing::shared_dir;

Engine& engine() {
  static std::unique_ptr<Engine> e = [] {
    EngineConfig c;
    c.model_path = shared_dir() + "/models/house-llama";
    c.page_size = 4;
    c.chunked_prefill_size = 8;
    auto made = Engine::create(c);
    EXPECT_TRUE(made.ok()) << made.status().to_string();
    return made.ok() ? std::move(made).value() : nullptr;
  }();
  return *e;
}

const Reference& reference() {
  static Reference r(shared_dir() + "/fixtures/house-llama/reference.safetensors");
  return r;
}

struct Result {
  std::vector<int32_t> tokens;
  std::vector<TokenLogprobs> prompt_logprobs;
  int32_t prompt_logprobs_from = -1;
  int events_with_prompt_logprobs = 0;
  bool finished = false;
};

// Submits every prompt at once (one batch; greedy, 2 new tokens) and returns each one's result.
std::vector<Result> run(const std::vector<std::vector<int32_t>>& prompts, int32_t from,
                        int top = 3) {
  std::vector<Result> out(prompts.size());
  std::mutex mu;
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerateRequest g;
    g.prompt_ids = prompts[i];
    g.params = SamplingParams{.temperature = 0.0f, .max_new_tokens = 2, .ignore_eos = true};
    g.top_logprobs = top;
    g.prompt_logprobs_from = from;
    g.on_event = [&out, &mu, i](const StreamEvent& ev) {
      std::lock_guard<std::mutex> lk(mu);
      Result& r = out[i];
      r.tokens.insert(r.tokens.end(), ev.token_ids.begin(), ev.token_ids.end());
      if (!ev.prompt_logprobs.empty() || (!ev.token_ids.empty() && r.tokens.size() == 1)) {
        // The first token's event carries them (possibly none).
        ++r.events_with_prompt_logprobs;
        r.prompt_logprobs = ev.prompt_logprobs;
        r.prompt_logprobs_from = ev.prompt_logprobs_from;
      }
      r.finished = r.finished || ev.finished;
    };
    auto id = engine().submit(std::move(g));
    EXPECT_TRUE(id.ok()) << id.status().to_string();
  }
  engine().wait_idle();
  return out;
}

// Checks r's prompt logprobs of ids from `from` against the reference logits of sequence `seq`:
// each token's logprob, and the top alternative where the reference's top two are apart.
void expect_matches_reference(const Result& r, const std::vector<int32_t>& ids, int seq,
                              int32_t from) {
  const std::vector<float> logits = reference().f32("seq" + std::to_string(seq) + ".logits");
  const int64_t vocab = int64_t(logits.size() / ids.size());
  const int32_t first = std::max(from, 1);
  ASSERT_EQ(r.prompt_logprobs_from, first);
  ASSERT_EQ(r.prompt_logprobs.size(), ids.size() - size_t(first)) << "seq " << seq;
  double worst = 0;
  for (size_t k = 0; k < r.prompt_logprobs.size(); ++k) {
    const size_t pos = size_t(first) + k;  // scored by the logits of position pos - 1
    const TokenLogprobs& got = r.prompt_logprobs[k];
    const std::vector<double> want = log_softmax(logits.data() + (pos - 1) * size_t(vocab), vocab);
    const double err = std::abs(double(got.logprob) - want[size_t(ids[pos])]);
    worst = std::max(worst, err);
    EXPECT_LT(err, 1e-4) << "seq " << seq << " position " << pos;
    ASSERT_EQ(got.top.size(), 3u);
    std::vector<int32_t> order(static_cast<size_t>(vocab));
    for (int64_t v = 0; v < vocab; ++v) order[size_t(v)] = int32_t(v);
    std::partial_sort(order.begin(), order.begin() + 2, order.end(),
                      [&](int32_t a, int32_t b) { return want[size_t(a)] > want[size_t(b)]; });
    if (want[size_t(order[0])] - want[size_t(order[1])] > 1e-2) {
      EXPECT_EQ(got.top[0].first, order[0]) << "seq " << seq << " position " << pos;
    }
    EXPECT_NEAR(got.top[0].second, want[size_t(got.top[0].first)], 1e-4);
  }
  std::printf("seq %d from %d: %zu prompt logprobs, max |error| %.2g against the HF logits\n", seq,
              from, r.prompt_logprobs.size(), worst);
}

TEST(EnginePromptLogprobs, EveryPositionMatchesTheReferenceInABatch) {
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 3; ++i)
    prompts.push_back(reference().i32("seq" + std::to_string(i) + ".input_ids"));
  const std::vector<Result> out = run(prompts, /*from=*/0);
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(out[size_t(i)].finished);
    EXPECT_EQ(out[size_t(i)].tokens.size(), 2u);
    EXPECT_EQ(out[size_t(i)].events_with_prompt_logprobs, 1);
    expect_matches_reference(out[size_t(i)], prompts[size_t(i)], i, 0);
  }
}

TEST(EnginePromptLogprobs, FromAStartPositionAndOverACachedPrefix) {
  const std::vector<int32_t> ids = reference().i32("seq2.input_ids");
  // The prompt's pages now sit in the prefix cache: the scored request computes them anyway.
  const std::vector<Result> plain = run({ids}, /*from=*/-1);
  ASSERT_EQ(plain[0].tokens.size(), 2u);
  EXPECT_EQ(plain[0].events_with_prompt_logprobs, 1);  // the first token's event, with none
  EXPECT_TRUE(plain[0].prompt_logprobs.empty());
  const std::vector<Result> scored = run({ids}, /*from=*/9);
  expect_matches_reference(scored[0], ids, 2, 9);
  // The greedy continuation is the same with or without scoring.
  EXPECT_EQ(scored[0].tokens, plain[0].tokens);
}

TEST(EnginePromptLogprobs, AStartAtOrPastThePromptsEndGivesNone) {
  const std::vector<int32_t> ids = reference().i32("seq0.input_ids");
  const std::vector<Result> out = run({ids}, int32_t(ids.size()));
  ASSERT_EQ(out[0].tokens.size(), 2u);
  EXPECT_TRUE(out[0].prompt_logprobs.empty());
  EXPECT_EQ(out[0].prompt_logprobs_from, int32_t(ids.size()));
}

TEST(EnginePromptLogprobs, RefusesANegativeStartAndAResumedGeneration) {
  GenerateRequest g;
  g.prompt_ids = reference().i32("seq0.input_ids");
  g.params.max_new_tokens = 4;
  g.top_logprobs = 0;
  g.prompt_logprobs_from = -2;
  auto bad = engine().submit(g);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("logprob_start_len"), std::string::npos);
  g.prompt_logprobs_from = 0;
  g.resume_output_ids = {5, 6};
  auto resumed = engine().submit(g);
  ASSERT_FALSE(resumed.ok());
  EXPECT_NE(resumed.status().message().find("resumed"), std::string::npos);
}

}  // namespace
}  // namespace strata
