// The request's sampling fields through the whole engine on house-llama (CPU reference): the
// penalties change each step's choice exactly as the rule says on the model's own logprobs,
// logit_bias bans and forces tokens, stop_token_ids stop, a seed reproduces the same tokens in any
// batch; and Model::forward_sample with logit edits equals forward + the reference edits + the
// reference sampler, with the logprob rows left as the model computed them.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <numeric>
#include <random>

#include "arch/model.h"
#include "engine/engine.h"
#include "engine/logit_edits.h"
#include "support/forward_sample_edits.h"

namespace strata {
namespace {

const std::string kHouse = std::string(STRATA_SHARED_DIR) + "/models/house-llama";

struct Result {
  std::vector<int32_t> tokens;
  std::string text;
  std::vector<TokenLogprobs> logprobs;
  FinishReason finish = FinishReason::kNone;
};

Engine& engine() {
  static std::unique_ptr<Engine> e = [] {
    EngineConfig c;
    c.model_path = kHouse;
    c.page_size = 4;
    auto made = Engine::create(c);
    EXPECT_TRUE(made.ok()) << made.status().to_string();
    return made.ok() ? std::move(made).value() : nullptr;
  }();
  return *e;
}

std::vector<int32_t> prompt() {
  return engine().tokenizer().encode("The old lighthouse keeper said that the sea");
}

// Submits every request at once (one batch) and returns each one's result.
std::vector<Result> run(std::vector<SamplingParams> params, int top_logprobs = -1) {
  std::vector<Result> out(params.size());
  std::mutex mu;
  for (size_t i = 0; i < params.size(); ++i) {
    GenerateRequest g;
    g.prompt_ids = prompt();
    g.params = params[i];
    g.top_logprobs = top_logprobs;
    g.on_event = [&out, &mu, i](const StreamEvent& ev) {
      std::lock_guard<std::mutex> lk(mu);
      out[i].tokens.insert(out[i].tokens.end(), ev.token_ids.begin(), ev.token_ids.end());
      out[i].text += ev.text;
      out[i].logprobs.insert(out[i].logprobs.end(), ev.logprobs.begin(), ev.logprobs.end());
      if (ev.finished) out[i].finish = ev.finish_reason;
    };
    auto id = engine().submit(std::move(g));
    EXPECT_TRUE(id.ok()) << id.status().to_string();
  }
  engine().wait_idle();
  return out;
}

// Presence and frequency shift a logit and its logprob alike, so each greedy choice must be the
// argmax of (the model's logprob - presence - frequency x count so far) over the top 20 the
// engine reports (the raw distribution): a token outside them starts lower and only loses.
TEST(EngineSamplingParams, PresenceAndFrequencyPenaltiesPickWhatTheRuleSays) {
  const SamplingParams p{.temperature = 0.0f,
                         .presence_penalty = 0.8f,
                         .frequency_penalty = 0.6f,
                         .max_new_tokens = 32,
                         .ignore_eos = true};
  const Result r = run({p}, /*top_logprobs=*/20)[0];
  ASSERT_EQ(r.tokens.size(), 32u);
  ASSERT_EQ(r.logprobs.size(), 32u);
  std::map<int32_t, int> counts;
  int checked = 0, penalized_steps = 0;
  for (size_t step = 0; step < r.tokens.size(); ++step) {
    const auto& top = r.logprobs[step].top;
    ASSERT_EQ(top.size(), 20u);
    float best = -INFINITY;
    int32_t want = -1;
    for (const auto& [id, lp] : top) {
      const int n = counts.count(id) ? counts[id] : 0;
      const float v = n > 0 ? lp - (0.8f + 0.6f * float(n)) : lp;
      if (v > best) best = v, want = id;
    }
    // Conclusive only when the winner stays above every token outside the top 20.
    if (best >= top.back().second) {
      ++checked;
      EXPECT_EQ(r.tokens[step], want) << "step " << step;
      penalized_steps += top.front().first != want;
    }
    ++counts[r.tokens[step]];
  }
  EXPECT_GE(checked, 24);
  // The penalties changed choices: greedy alone would pick the top token every time.
  EXPECT_GT(penalized_steps, 0);
  std::printf(
      "presence/frequency: %d of 32 steps checked, %d chose other than the model's top token\n",
      checked, penalized_steps);
}

TEST(EngineSamplingParams, LogitBiasBansAndForcesTokens) {
  const SamplingParams greedy{.temperature = 0.0f, .max_new_tokens = 6, .ignore_eos = true};
  const Result plain = run({greedy}, 2)[0];
  ASSERT_EQ(plain.tokens.size(), 6u);
  SamplingParams ban = greedy;
  ban.logit_bias = {{plain.tokens[0], -100.0f}};
  SamplingParams force = greedy;
  force.temperature = 1.0f;
  force.seed = 9;
  force.logit_bias = {{1000, 100.0f}};
  const std::vector<Result> r = run({ban, force});
  // Banned: the first choice is the model's second best.
  EXPECT_EQ(r[0].tokens[0], plain.logprobs[0].top[1].first);
  EXPECT_EQ(r[1].tokens, std::vector<int32_t>(6, 1000));
}

TEST(EngineSamplingParams, StopTokenIdsFinishTheRequest) {
  const SamplingParams greedy{.temperature = 0.0f, .max_new_tokens = 8, .ignore_eos = true};
  const Result plain = run({greedy})[0];
  ASSERT_EQ(plain.tokens.size(), 8u);
  SamplingParams stop = greedy;
  stop.stop_token_ids = {plain.tokens[3]};
  const Result r = run({stop})[0];
  const size_t first = size_t(std::find(plain.tokens.begin(), plain.tokens.end(), plain.tokens[3]) -
                              plain.tokens.begin());
  EXPECT_EQ(r.tokens, std::vector<int32_t>(plain.tokens.begin(), plain.tokens.begin() + first + 1));
  EXPECT_EQ(r.finish, FinishReason::kStop);
}

// min_new_tokens: the stop token cannot be sampled before it (greedy takes the model's second
// best there), may be after it; a stop string is not looked for before it.
TEST(EngineSamplingParams, MinNewTokensHoldsOffStopTokensAndStopStrings) {
  const SamplingParams greedy{.temperature = 0.0f, .max_new_tokens = 8, .ignore_eos = true};
  const Result plain = run({greedy}, 2)[0];
  ASSERT_EQ(plain.tokens.size(), 8u);
  const int32_t t = plain.tokens[1];
  const size_t first =
      size_t(std::find(plain.tokens.begin(), plain.tokens.end(), t) - plain.tokens.begin());
  SamplingParams held = greedy;
  held.stop_token_ids = {t};
  held.min_new_tokens = int32_t(first) + 3;
  const Result r = run({held})[0];
  ASSERT_GT(r.tokens.size(), first);
  EXPECT_EQ(
      std::vector<int32_t>(r.tokens.begin(), r.tokens.begin() + std::ptrdiff_t(first)),
      std::vector<int32_t>(plain.tokens.begin(), plain.tokens.begin() + std::ptrdiff_t(first)));
  EXPECT_EQ(r.tokens[first], plain.logprobs[first].top[1].first);
  EXPECT_GE(r.tokens.size(), size_t(held.min_new_tokens));
  for (size_t i = 0; i < r.tokens.size(); ++i)
    if (r.tokens[i] == t) {
      EXPECT_GE(i, size_t(held.min_new_tokens)) << "the stop token at " << i;
      EXPECT_EQ(i + 1, r.tokens.size()) << "and it stops";
    }
  EXPECT_EQ(r.finish, r.tokens.back() == t ? FinishReason::kStop : FinishReason::kLength);
  // A stop string that the first token's text holds: found at once without min_new_tokens, not
  // before it with.
  const std::string head = engine().tokenizer().decode(std::vector<int32_t>{plain.tokens[0]});
  ASSERT_FALSE(head.empty());
  SamplingParams by_string = greedy;
  by_string.stop_strings = {head};
  SamplingParams by_string_held = by_string;
  by_string_held.min_new_tokens = 4;
  const std::vector<Result> s = run({by_string, by_string_held});
  EXPECT_EQ(s[0].text, "");
  EXPECT_EQ(s[0].finish, FinishReason::kStop);
  EXPECT_EQ(s[1].text.rfind(head, 0), 0u) << s[1].text;
  EXPECT_GE(s[1].tokens.size(), 4u);
}

// A stop string ends the text before it, or with it under include_stop_str_in_output.
TEST(EngineSamplingParams, IncludeStopStrInOutputKeepsTheMatchedString) {
  const SamplingParams greedy{.temperature = 0.0f, .max_new_tokens = 8, .ignore_eos = true};
  const Result plain = run({greedy})[0];
  ASSERT_EQ(plain.tokens.size(), 8u);
  const std::string stop = engine().tokenizer().decode(std::vector<int32_t>{plain.tokens[2]});
  ASSERT_FALSE(stop.empty());
  const size_t at = plain.text.find(stop);
  ASSERT_NE(at, std::string::npos) << plain.text;
  SamplingParams cut = greedy;
  cut.stop_strings = {stop};
  SamplingParams kept = cut;
  kept.include_stop_str_in_output = true;
  const std::vector<Result> r = run({cut, kept});
  EXPECT_EQ(r[0].text, plain.text.substr(0, at));
  EXPECT_EQ(r[1].text, plain.text.substr(0, at + stop.size()));
  EXPECT_EQ(r[0].finish, FinishReason::kStop);
  EXPECT_EQ(r[1].finish, FinishReason::kStop);
}

// Every new field at once, sampled: the same seed gives the same tokens alone and in a batch
// with other requests.
TEST(EngineSamplingParams, SeededRequestsAreReproducibleInAnyBatch) {
  const SamplingParams p{.temperature = 0.9f,
                         .top_p = 0.95f,
                         .top_k = 60,
                         .min_p = 0.02f,
                         .repetition_penalty = 1.3f,
                         .presence_penalty = 0.2f,
                         .frequency_penalty = 0.1f,
                         .logit_bias = {{13, -5.0f}, {2000, 1.5f}},
                         .seed = 1234,
                         .max_new_tokens = 16,
                         .ignore_eos = true};
  const Result alone = run({p})[0];
  ASSERT_EQ(alone.tokens.size(), 16u);
  SamplingParams other = p;
  other.seed = 77;
  const std::vector<Result> batch =
      run({other, p, SamplingParams{.temperature = 0.0f, .max_new_tokens = 5}});
  EXPECT_EQ(batch[1].tokens, alone.tokens);
  EXPECT_NE(batch[0].tokens, alone.tokens);
}

// Model level: forward_sample with edits on some rows equals forward, then the reference edits
// (edit_logit_reference) and the reference sampler on the host; the kept rows are the raw logits.
TEST(EngineSamplingParams, ForwardSampleAppliesEditsBeforeSamplingAndKeepsRawLogprobRows) {
  auto be = make_cpu_backend();
  auto m = load_model(kHouse, *be);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  testing::check_forward_sample_edits(**m, be->activation_dtype(), /*n=*/24, /*page=*/8,
                                      /*seed=*/3, /*keep=*/{1, 4, 23}, /*edits_in_bf16=*/false);
}

}  // namespace
}  // namespace strata
