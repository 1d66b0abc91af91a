// The penalties and logit_bias on the CPU reference sampler, as SGLang applies them: presence and
// frequency are subtracted from the generated tokens, then the repetition penalty divides their
// positive logits and multiplies their negative ones, then logit_bias is added; the prompt's
// tokens are not penalized. Plus min_p's cut and seeded reproducibility on the same path, and
// min_new_tokens' bans.
#include "engine/logit_edits.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <set>
#include <vector>

#include "engine/sampler.h"

namespace strata {
namespace {

// Row 0 of `logits` after the edits of `params` with `output` generated and `banned` tokens,
// through the CPU backend's op (the path the engine takes).
std::vector<float> edited(std::vector<float> logits, const SamplingParams& params,
                          const std::vector<int32_t>& output,
                          const std::vector<int32_t>& banned = {}) {
  OutputTokenCounts counts;
  counts.add(output);
  std::vector<LogitEdit> edits;
  append_logit_edits(params, counts, 0, banned, &edits);
  auto be = make_cpu_backend();
  be->edit_logits(Tensor::make(logits.data(), DType::kF32, {1, int64_t(logits.size())}),
                  edits.data(), int64_t(edits.size()));
  return logits;
}

TEST(LogitEdits, RepetitionPenaltyDividesPositiveAndMultipliesNegativeLogitsOfGeneratedTokens) {
  const std::vector<float> row{2.0f, -2.0f, 1.0f, 3.0f, -1.0f};
  EXPECT_EQ(edited(row, {.repetition_penalty = 2.0f}, {0, 1, 0}),
            (std::vector<float>{1.0f, -4.0f, 1.0f, 3.0f, -1.0f}));
  // Below 1 it rewards instead.
  EXPECT_EQ(edited(row, {.repetition_penalty = 0.5f}, {3, 4}),
            (std::vector<float>{2.0f, -2.0f, 1.0f, 6.0f, -0.5f}));
}

TEST(LogitEdits, PresenceOnceAndFrequencyPerOccurrenceAreSubtracted) {
  const std::vector<float> row{2.0f, -2.0f, 1.0f, 3.0f, -1.0f};
  EXPECT_EQ(
      edited(row, {.presence_penalty = 0.5f, .frequency_penalty = 0.25f}, {2, 2, 4, 2}),
      (std::vector<float>{2.0f, -2.0f, 1.0f - (0.5f + 3 * 0.25f), 3.0f, -1.0f - (0.5f + 0.25f)}));
  // Negative values reward repeats.
  EXPECT_EQ(edited(row, {.presence_penalty = -1.0f}, {0}),
            (std::vector<float>{3.0f, -2.0f, 1.0f, 3.0f, -1.0f}));
}

TEST(LogitEdits, SubtractThenScaleThenBiasAsSglang) {
  // 1.0 - presence 2 = -1 (now negative), x repetition 2 = -2, + bias 0.5 = -1.5. Scaling first
  // would give 0.5 - 2 + 0.5 = -1.
  const std::vector<float> row{1.0f, 0.0f};
  EXPECT_EQ(
      edited(row, {.repetition_penalty = 2.0f, .presence_penalty = 2.0f, .logit_bias = {{0, 0.5f}}},
             {0}),
      (std::vector<float>{-1.5f, 0.0f}));
}

TEST(LogitEdits, LogitBiasAddsToAnyTokenOnceEvenWhenAlsoPenalized) {
  const std::vector<float> row{2.0f, -2.0f, 1.0f, 3.0f};
  const SamplingParams p{.repetition_penalty = 2.0f, .logit_bias = {{0, 1.0f}, {3, -100.0f}}};
  EXPECT_EQ(edited(row, p, {0}), (std::vector<float>{2.0f, -2.0f, 1.0f, -97.0f}));
  OutputTokenCounts counts;
  counts.add(std::vector<int32_t>{0, 0, 2});
  std::vector<LogitEdit> edits;
  append_logit_edits(p, counts, 7, {}, &edits);
  std::set<int32_t> tokens;
  for (const LogitEdit& e : edits) {
    EXPECT_EQ(e.row, 7);
    EXPECT_TRUE(tokens.insert(e.token).second) << "token " << e.token << " edited twice";
  }
  EXPECT_EQ(tokens, (std::set<int32_t>{0, 2, 3}));
  // Nothing to do without penalties or a bias; a bias alone touches only its tokens.
  edits.clear();
  append_logit_edits({}, counts, 0, {}, &edits);
  EXPECT_TRUE(edits.empty());
  append_logit_edits({.logit_bias = {{1, 5.0f}}}, counts, 0, {}, &edits);
  ASSERT_EQ(edits.size(), 1u);
  EXPECT_EQ(edits[0].token, 1);
  EXPECT_EQ(edits[0].scale, 1.0f);
  EXPECT_EQ(edits[0].subtract, 0.0f);
}

TEST(LogitEdits, MinNewTokensBansStopAndEosTokensBeforeItsPosition) {
  const SamplingParams p{.min_new_tokens = 3, .stop_token_ids = {4, 9}};
  const std::vector<int32_t> eos{2, 9};
  std::vector<int32_t> banned;
  min_tokens_banned(p, 0, eos, &banned);
  EXPECT_EQ(banned, (std::vector<int32_t>{4, 9, 2, 9}));  // duplicates merge in the edits
  min_tokens_banned(p, 2, eos, &banned);
  EXPECT_EQ(banned.size(), 4u);
  min_tokens_banned(p, 3, eos, &banned);  // the fourth token may stop
  EXPECT_TRUE(banned.empty());
  SamplingParams ignore = p;
  ignore.ignore_eos = true;
  min_tokens_banned(ignore, 0, eos, &banned);
  EXPECT_EQ(banned, (std::vector<int32_t>{4, 9}));
  min_tokens_banned({}, 0, eos, &banned);  // min_new_tokens 0: nothing
  EXPECT_TRUE(banned.empty());
}

TEST(LogitEdits, BannedTokensGetMinusInfinityOnceMergedWithTheirOtherEdits) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> row{2.0f, -2.0f, 1.0f, 3.0f, 0.5f};
  // Alone; with a penalty on the same token; with a logit_bias on it; named twice.
  EXPECT_EQ(edited(row, {}, {}, {3}), (std::vector<float>{2.0f, -2.0f, 1.0f, -inf, 0.5f}));
  const SamplingParams pen{.repetition_penalty = 2.0f, .logit_bias = {{4, 1.0f}}};
  EXPECT_EQ(edited(row, pen, {3, 0}, {3, 4, 3}),
            (std::vector<float>{1.0f, -2.0f, 1.0f, -inf, -inf}));
  OutputTokenCounts counts;
  counts.add(std::vector<int32_t>{3, 0});
  std::vector<LogitEdit> edits{LogitEdit{.row = 0, .token = 3}};  // another row's edit before
  append_logit_edits(pen, counts, 1, std::vector<int32_t>{3, 4, 3}, &edits);
  std::set<int32_t> tokens;
  for (size_t i = 1; i < edits.size(); ++i) {
    EXPECT_EQ(edits[i].row, 1);
    EXPECT_TRUE(tokens.insert(edits[i].token).second) << "token " << edits[i].token << " twice";
  }
  EXPECT_EQ(tokens, (std::set<int32_t>{0, 3, 4}));
  EXPECT_EQ(edits[0].bias, 0.0f) << "the earlier row's edit is not this row's";
}

TEST(LogitEdits, BiasBansAndForcesTokensOfTheSampler) {
  const std::vector<float> row{0.5f, 4.0f, 1.0f, -3.0f};
  auto be = make_cpu_backend();
  std::vector<std::pair<float, int32_t>> scratch;
  SamplerRng rng(1);
  auto pick = [&](const SamplingParams& p) {
    const std::vector<float> l = edited(row, p, {});
    return sample_token(l.data(), int64_t(l.size()), p, rng, scratch);
  };
  EXPECT_EQ(pick({.temperature = 0.0f}), 1);
  EXPECT_EQ(pick({.temperature = 0.0f, .logit_bias = {{1, -100.0f}}}), 2);
  for (int i = 0; i < 20; ++i)
    EXPECT_EQ(pick({.temperature = 1.0f, .logit_bias = {{3, 100.0f}}}), 3);
}

TEST(LogitEdits, MinPCutsTokensBelowItsShareOfTheTopProbability) {
  // Probabilities 0.5, 0.3, 0.2 at temperature 1.
  const std::vector<float> row{std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  std::vector<std::pair<float, int32_t>> scratch;
  std::set<int32_t> seen_half, seen_most;
  for (int i = 0; i < 400; ++i) {
    const double u = (i + 0.5) / 400;
    const SampleRowParams half{
        .temperature = 1.0f, .min_p = 0.5f, .uniform = u};  // 0.2 < 0.25: cut
    const SampleRowParams most{.temperature = 1.0f, .min_p = 0.7f, .uniform = u};  // only 0.5 stays
    seen_half.insert(sample_row_reference(row.data(), 3, half, scratch));
    seen_most.insert(sample_row_reference(row.data(), 3, most, scratch));
  }
  EXPECT_EQ(seen_half, (std::set<int32_t>{0, 1}));
  EXPECT_EQ(seen_most, (std::set<int32_t>{0}));
  // The request's min_p reaches the row parameters.
  SamplerRng rng(3);
  EXPECT_EQ(draw_row_params({.temperature = 1.0f, .min_p = 0.25f}, rng).min_p, 0.25f);
}

TEST(LogitEdits, SeededSamplingWithEditsIsReproducible) {
  std::mt19937_64 g(5);
  std::vector<float> row(257);
  for (float& v : row) v = std::normal_distribution<float>(0, 2)(g);
  const SamplingParams p{.temperature = 0.9f,
                         .top_p = 0.95f,
                         .top_k = 50,
                         .min_p = 0.01f,
                         .repetition_penalty = 1.3f,
                         .frequency_penalty = 0.2f,
                         .logit_bias = {{4, 2.0f}}};
  auto run = [&](uint64_t seed) {
    SamplerRng rng(seed);
    std::vector<int32_t> out;
    std::vector<std::pair<float, int32_t>> scratch;
    for (int step = 0; step < 40; ++step) {
      const std::vector<float> l = edited(row, p, out);
      out.push_back(sample_token(l.data(), int64_t(l.size()), p, rng, scratch));
    }
    return out;
  };
  EXPECT_EQ(run(42), run(42));
  EXPECT_NE(run(42), run(43));
}

}  // namespace
}  // namespace strata
