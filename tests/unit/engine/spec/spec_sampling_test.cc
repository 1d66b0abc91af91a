// Speculative sampling keeps the target's distribution (engine/spec/verify.h): a toy target (a
// Markov chain over 6 tokens, the next token's logits a function of the last) with temperature
// and top-k, deterministic drafts, the engine's rule (every row sampled by the ordinary sampler
// with its own draw; accept the longest agreeing prefix plus the first disagreeing sample), run
// until 3 tokens are out, many times. A chi-squared test compares the 216 three-token sequences'
// counts with their exact probabilities. The same test must reject a classic bug (a rejected
// position resampled from p instead of p without the draft), so it has the power to see one.
#include <gtest/gtest.h>

#include "engine/sampler.h"
#include "engine/spec/verify.h"
#include "spec_stats.h"

namespace strata {
namespace {

using spec_stats::ChiSquaredTest;
using spec_stats::generate_by_steps;
using spec_stats::kVocab;
using spec_stats::plain_tokens;
using spec_stats::sequences_chi_squared;
using spec_stats::ToyTarget;

// A deterministic drafter: proposes (last * 5 + 1) % kVocab, then (that * 5 + 1) % kVocab.
std::vector<int32_t> draft(int last, int n) {
  std::vector<int32_t> d;
  for (int i = 0; i < n; ++i) d.push_back(last = (last * 5 + 1) % kVocab);
  return d;
}

// Generates kLen tokens after `start` by verify steps of 2 drafts each, as the engine does: row i
// samples with the draw of its output position (peek), the kept tokens take theirs. `buggy`: a
// rejected row's token is drawn afresh from p (the draft included) instead of being that row's
// own sample.
std::vector<int32_t> generate(const ToyTarget& t, int start, SamplerRng& rng, SamplerRng& other,
                              bool buggy, std::vector<std::pair<float, int32_t>>& scratch) {
  return generate_by_steps(start, rng, [&](int last) {
    const std::vector<int32_t> d = draft(last, 2);
    // Row i: the target after the committed tokens and d[0..i).
    std::vector<int32_t> rows;
    int ctx = last;
    for (size_t i = 0; i <= d.size(); ++i) {
      rows.push_back(t.sample(ctx, rng.peek(i), scratch));
      if (i < d.size()) ctx = d[i];
    }
    const int32_t a = accepted_drafts(rows, d);
    std::vector<int32_t> committed(d.begin(), d.begin() + a);
    int32_t next = rows[size_t(a)];
    if (buggy && size_t(a) < d.size())
      next = t.sample(a == 0 ? last : d[size_t(a) - 1], other.uniform(), scratch);
    committed.push_back(next);
    return committed;
  });
}

ChiSquaredTest run(bool buggy, int64_t draws) {
  ToyTarget t;
  SamplerRng rng(12345), other(999);
  std::vector<std::pair<float, int32_t>> scratch;
  return sequences_chi_squared(t, /*start=*/2, draws, [&](int start) {
    return generate(t, start, rng, other, buggy, scratch);
  });
}

TEST(SpeculativeSampling, MatchesTheTargetDistribution) {
  const ChiSquaredTest r = run(/*buggy=*/false, 200000);
  EXPECT_GT(r.df, 20);
  EXPECT_LT(r.stat, r.crit) << "chi2 " << r.stat << " with " << r.df << " df";
}

TEST(SpeculativeSampling, TheTestRejectsResamplingFromTheFullDistribution) {
  const ChiSquaredTest r = run(/*buggy=*/true, 200000);
  EXPECT_GT(r.stat, r.crit) << "chi2 " << r.stat << " with " << r.df << " df";
}

// With the draws of output positions, the speculative tokens are plain sampling's, draw for draw.
TEST(SpeculativeSampling, SameDrawsGiveThePlainSamplersTokens) {
  ToyTarget t;
  std::vector<std::pair<float, int32_t>> scratch;
  for (uint64_t seed = 0; seed < 200; ++seed) {
    SamplerRng spec_rng(seed), other(1), plain_rng(seed);
    const std::vector<int32_t> spec = generate(t, 1, spec_rng, other, false, scratch);
    EXPECT_EQ(spec, plain_tokens(t, 1, plain_rng, scratch)) << "seed " << seed;
    EXPECT_EQ(spec_rng.draws(), plain_rng.draws());
  }
}

TEST(SpeculativeSampling, PeekDoesNotTakeADraw) {
  SamplerRng a(5), b(5);
  const double p1 = a.peek(1), p0 = a.peek(0);
  EXPECT_EQ(a.draws(), 0u);
  EXPECT_NE(p0, p1);
  EXPECT_EQ(b.uniform(), p0);
  EXPECT_EQ(a.uniform(), p0);
  EXPECT_EQ(a.uniform(), p1);
  EXPECT_EQ(a.draws(), 2u);
  SamplerRng c(5, 2);  // a resumed stream continues where `a` is
  EXPECT_EQ(c.uniform(), a.uniform());
}

TEST(SpeculativeSampling, AcceptedDraftsIsTheLongestAgreeingPrefix) {
  EXPECT_EQ(accepted_drafts(std::vector<int32_t>{5}, std::vector<int32_t>{}), 0);
  EXPECT_EQ(accepted_drafts(std::vector<int32_t>{1, 2, 3}, std::vector<int32_t>{1, 2}), 2);
  EXPECT_EQ(accepted_drafts(std::vector<int32_t>{1, 9, 3}, std::vector<int32_t>{1, 2}), 1);
  EXPECT_EQ(accepted_drafts(std::vector<int32_t>{7, 2, 3}, std::vector<int32_t>{1, 2}), 0);
}

}  // namespace
}  // namespace strata
