// The toy target and the chi-squared scaffolding of the speculative sampling tests
// (spec_sampling_test.cc for chains, tree_verify_test.cc for draft trees): a Markov chain over
// 6 tokens whose next-token logits are a function of the last token, sampled with temperature and
// top-k by the engine's own sampler; generation by verify steps, plain sampling, and the
// chi-squared test of generated sequences against the chain's exact probabilities.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <utility>
#include <vector>

#include "engine/sampler.h"

namespace strata::spec_stats {

constexpr int kVocab = 6;
constexpr int kLen = 3;  // tokens generated per draw

struct ToyTarget {
  float logits[kVocab][kVocab];  // [last token][next token]
  SampleRowParams params{.temperature = 0.8f, .top_p = 1.0f, .top_k = 4, .min_p = 0.0f};

  ToyTarget() {
    std::mt19937 g(3);
    std::normal_distribution<float> n(0.0f, 1.2f);
    for (auto& row : logits)
      for (float& x : row) x = n(g);
  }
  // The exact next-token distribution (softmax at the temperature over the top 4).
  std::vector<double> probs(int last) const {
    std::vector<std::pair<float, int>> c;
    for (int v = 0; v < kVocab; ++v) c.push_back({logits[last][v], v});
    std::sort(c.begin(), c.end(), [](auto a, auto b) {
      return a.first != b.first ? a.first > b.first : a.second < b.second;
    });
    std::vector<double> p(kVocab, 0.0);
    double z = 0;
    for (int i = 0; i < params.top_k; ++i)
      z += std::exp(double(c[size_t(i)].first) / params.temperature);
    for (int i = 0; i < params.top_k; ++i)
      p[size_t(c[size_t(i)].second)] =
          std::exp(double(c[size_t(i)].first) / params.temperature) / z;
    return p;
  }
  int sample(int last, double u, std::vector<std::pair<float, int32_t>>& scratch) const {
    SampleRowParams p = params;
    p.uniform = u;
    return sample_row_reference(logits[last], kVocab, p, scratch);
  }
};

// Chi-squared statistic and degrees of freedom over cells with expected count >= 5 (the rest
// pooled into one cell).
inline std::pair<double, int> chi_squared(const std::map<int, int64_t>& counts,
                                          const std::vector<double>& expected) {
  double stat = 0, pooled_e = 0, pooled_o = 0;
  int cells = 0;
  for (size_t k = 0; k < expected.size(); ++k) {
    auto it = counts.find(int(k));
    const double o = it == counts.end() ? 0.0 : double(it->second);
    if (expected[k] < 5) {
      pooled_e += expected[k];
      pooled_o += o;
      continue;
    }
    stat += (o - expected[k]) * (o - expected[k]) / expected[k];
    ++cells;
  }
  if (pooled_e > 0) {
    stat += (pooled_o - pooled_e) * (pooled_o - pooled_e) / pooled_e;
    ++cells;
  }
  return {stat, cells - 1};
}

// The chi-squared critical value at upper tail 1e-4 (Wilson-Hilferty; z = 3.719).
inline double critical(int df) {
  const double z = 3.719, k = double(df);
  return k * std::pow(1.0 - 2.0 / (9.0 * k) + z * std::sqrt(2.0 / (9.0 * k)), 3.0);
}

// The exact expected counts of the kVocab³ three-token sequences after `start` in `draws`
// samples, indexed (a · kVocab + b) · kVocab + c.
inline std::vector<double> expected_counts(const ToyTarget& t, int start, int64_t draws) {
  std::vector<double> expected(kVocab * kVocab * kVocab, 0.0);
  const std::vector<double> p0 = t.probs(start);
  for (int a = 0; a < kVocab; ++a) {
    const std::vector<double> p1 = t.probs(a);
    for (int b = 0; b < kVocab; ++b) {
      const std::vector<double> p2 = t.probs(b);
      for (int c = 0; c < kVocab; ++c)
        expected[size_t((a * kVocab + b) * kVocab + c)] =
            double(draws) * p0[size_t(a)] * p1[size_t(b)] * p2[size_t(c)];
    }
  }
  return expected;
}

// kLen tokens after `start` by verify steps, as the engine keeps them: step(last) gives a step's
// committed tokens after token `last`; each token kept takes its draw from rng (the sampler's
// draws of output positions).
template <class Step>
std::vector<int32_t> generate_by_steps(int start, SamplerRng& rng, Step step) {
  std::vector<int32_t> out;
  int last = start;
  while (int(out.size()) < kLen) {
    for (int32_t x : step(last)) {
      if (int(out.size()) == kLen) break;
      out.push_back(x);
      rng.uniform();  // the kept token's draw
    }
    last = out.back();
  }
  return out;
}

// Plain sampling of kLen tokens after `start`, one draw a token: what a speculative rule that
// uses the draws of output positions must give, draw for draw.
inline std::vector<int32_t> plain_tokens(const ToyTarget& t, int start, SamplerRng& rng,
                                         std::vector<std::pair<float, int32_t>>& scratch) {
  std::vector<int32_t> out;
  int last = start;
  for (int i = 0; i < kLen; ++i) out.push_back(last = t.sample(last, rng.uniform(), scratch));
  return out;
}

// The chi-squared test of `draws` sequences generate(start) against the target's exact
// probabilities: the sampling rule keeps the distribution when stat < crit (upper tail 1e-4).
struct ChiSquaredTest {
  double stat = 0, crit = 0;
  int df = 0;
};
template <class Generate>
ChiSquaredTest sequences_chi_squared(const ToyTarget& t, int start, int64_t draws,
                                     Generate generate) {
  std::map<int, int64_t> counts;
  for (int64_t i = 0; i < draws; ++i) {
    const std::vector<int32_t> s = generate(start);
    counts[(s[0] * kVocab + s[1]) * kVocab + s[2]]++;
  }
  auto [stat, df] = chi_squared(counts, expected_counts(t, start, draws));
  return {stat, critical(df), df};
}

}  // namespace strata::spec_stats
