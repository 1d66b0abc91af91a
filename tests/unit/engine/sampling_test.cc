// The sampling op's CPU twin (Backend::sample, sample_row_reference) against the engine's
// sample_token and against a direct transcription of the rules (a full sort, softmax at
// temperature, the cuts, the inverse CDF): same tokens, same draws from each request's stream,
// and the defined edge cases (ties, NaN, infinities, top-k 1, top-p boundaries, min-p).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "engine/sampler.h"

namespace strata {
namespace {

// The rules written out plainly (finite logits only): what every backend must return.
int32_t plain_sample(const std::vector<float>& logits, const SampleRowParams& p) {
  const int64_t vocab = int64_t(logits.size());
  if (p.temperature <= 0.0f || p.top_k == 1)
    return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
  std::vector<int32_t> order(logits.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = int32_t(i);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return logits[size_t(a)] > logits[size_t(b)]; });
  if (p.top_k > 0 && p.top_k < vocab) order.resize(size_t(p.top_k));
  std::vector<float> w;
  double total = 0;
  for (int32_t id : order) {
    w.push_back(
        float(std::exp(double(logits[size_t(id)] - logits[size_t(order[0])]) / p.temperature)));
    total += w.back();
  }
  size_t keep = 0;
  while (keep < w.size() && !(p.min_p > 0 && w[keep] < w[0] * p.min_p)) ++keep;
  if (p.top_p < 1.0f) {
    double mass = 0;
    for (size_t i = 0; i < keep; ++i)
      if ((mass += w[i] / total) >= p.top_p) {
        keep = i + 1;
        break;
      }
  }
  keep = std::max<size_t>(keep, 1);
  double kept = 0;
  for (size_t i = 0; i < keep; ++i) kept += w[i];
  double r = p.uniform * kept;
  for (size_t i = 0; i < keep; ++i)
    if ((r -= w[i]) < 0) return order[i];
  return order[keep - 1];
}

SampleRowParams random_params(std::mt19937_64& g, int64_t vocab) {
  SampleRowParams p;
  const int kind = int(g() % 6);
  p.temperature = kind == 0 ? 0.0f : std::uniform_real_distribution<float>(0.2f, 2.0f)(g);
  if (kind == 2 || kind == 5) p.top_k = int32_t(1 + g() % uint64_t(std::min<int64_t>(vocab, 60)));
  if (kind == 3 || kind == 5) p.top_p = std::uniform_real_distribution<float>(0.05f, 1.0f)(g);
  if (kind == 4) p.min_p = std::uniform_real_distribution<float>(0.0f, 0.5f)(g);
  p.uniform = std::uniform_real_distribution<double>(0.0, 1.0)(g);
  return p;
}

std::vector<float> random_logits(std::mt19937_64& g, int64_t vocab, bool bf16_ties) {
  std::normal_distribution<float> d(0.0f, 3.0f);
  std::vector<float> v(static_cast<size_t>(vocab));
  for (float& x : v) x = bf16_ties ? round_to_bf16(d(g)) : d(g);
  return v;
}

TEST(Sampling, ReferenceFollowsTheRules) {
  std::mt19937_64 g(7);
  std::vector<std::pair<float, int32_t>> scratch;
  for (int it = 0; it < 400; ++it) {
    const int64_t vocab = 1 + int64_t(g() % 300);
    const auto logits = random_logits(g, vocab, it % 2 == 0);
    const SampleRowParams p = random_params(g, vocab);
    EXPECT_EQ(sample_row_reference(logits.data(), vocab, p, scratch), plain_sample(logits, p))
        << "case " << it << " vocab " << vocab << " T " << p.temperature << " top_k " << p.top_k
        << " top_p " << p.top_p << " min_p " << p.min_p << " u " << p.uniform;
  }
}

TEST(Sampling, CpuBackendEqualsSampleTokenAndDrawsOncePerSampledToken) {
  auto be = make_cpu_backend();
  std::mt19937_64 g(11);
  const int rows = 37;
  const int64_t vocab = 513;
  std::vector<float> logits;
  std::vector<SamplingParams> cfgs;
  for (int r = 0; r < rows; ++r) {
    const auto row = random_logits(g, vocab, true);
    logits.insert(logits.end(), row.begin(), row.end());
    const SampleRowParams p = random_params(g, vocab);
    cfgs.push_back(
        {.temperature = p.temperature, .top_p = p.top_p, .top_k = p.top_k, .min_p = p.min_p});
  }
  for (int step = 0; step < 3; ++step) {
    std::vector<SamplerRng> a, b;
    for (int r = 0; r < rows; ++r) {
      a.emplace_back(uint64_t(r) * 31 + uint64_t(step));
      b.emplace_back(uint64_t(r) * 31 + uint64_t(step));
    }
    std::vector<SampleRowParams> params;
    for (int r = 0; r < rows; ++r) params.push_back(draw_row_params(cfgs[size_t(r)], a[size_t(r)]));
    std::vector<int32_t> ids(size_t(rows), -1);
    Tensor t = Tensor::make(logits.data(), DType::kF32, {rows, vocab});
    be->sample(t, params.data(), ids.data());
    std::vector<std::pair<float, int32_t>> scratch;
    for (int r = 0; r < rows; ++r) {
      const int32_t want =
          sample_token(logits.data() + r * vocab, vocab, cfgs[size_t(r)], b[size_t(r)], scratch);
      EXPECT_EQ(ids[size_t(r)], want) << "row " << r;
      // Both streams advanced identically: their next draws agree.
      EXPECT_EQ(a[size_t(r)].uniform(), b[size_t(r)].uniform()) << "row " << r;
    }
  }
  // Greedy draws nothing; a sampled token draws exactly one.
  SamplerRng s1(5), s2(5);
  draw_row_params({.temperature = 0.0f}, s1);
  draw_row_params({.temperature = 1.0f, .top_k = 1}, s1);
  EXPECT_EQ(s1.uniform(), s2.uniform());
  draw_row_params({.temperature = 1.0f}, s1);
  s2.uniform();
  EXPECT_EQ(s1.uniform(), s2.uniform());
}

int32_t ref(const std::vector<float>& v, SampleRowParams p) {
  std::vector<std::pair<float, int32_t>> scratch;
  return sample_row_reference(v.data(), int64_t(v.size()), p, scratch);
}

TEST(Sampling, EdgeCases) {
  const float inf = INFINITY, nan = NAN;
  const SampleRowParams greedy{};
  SampleRowParams hot{.temperature = 1.0f, .uniform = 0.99};
  // Greedy: ties (and +-0) to the lowest id; NaN skipped unless it is element 0.
  EXPECT_EQ(ref({1, 3, 3, 2}, greedy), 1);
  EXPECT_EQ(ref({-0.0f, 0.0f, -1}, greedy), 0);
  EXPECT_EQ(ref({0, nan, 5, nan}, greedy), 2);
  EXPECT_EQ(ref({nan, 1, 5}, greedy), 0);
  EXPECT_EQ(ref({-inf, -inf, -inf}, greedy), 0);
  // Sampling: NaN counts as -inf (never drawn); +inf or an all -inf/NaN row gives greedy.
  for (double u : {0.0, 0.3, 0.999999}) {
    hot.uniform = u;
    EXPECT_EQ(ref({nan, 2, nan, 2}, hot), u < 0.5 ? 1 : 3);
    EXPECT_EQ(ref({1, inf, 0, inf}, hot), 1);
    EXPECT_EQ(ref({-inf, nan, -inf}, hot), 0);
    EXPECT_EQ(ref({-inf, 1, -inf}, hot), 1);
  }
  // top_k 1 is greedy; top_k cuts ties at its boundary by id.
  EXPECT_EQ(ref({1, 5, 5}, {.temperature = 1.0f, .top_k = 1, .uniform = 0.9}), 1);
  EXPECT_EQ(ref({5, 1, 5, 5}, {.temperature = 1.0f, .top_k = 2, .uniform = 0.9}), 2);
  // top_p exactly on a boundary: two equal halves, top_p 0.5 keeps the first only.
  EXPECT_EQ(ref({2, 2}, {.temperature = 1.0f, .top_p = 0.5f, .uniform = 0.9}), 0);
  EXPECT_EQ(ref({2, 2}, {.temperature = 1.0f, .top_p = 0.51f, .uniform = 0.9}), 1);
  // min_p drops what is below min_p × the top probability.
  EXPECT_EQ(ref({0, std::log(0.5f), -20}, {.temperature = 1.0f, .min_p = 0.6f, .uniform = 0.99}),
            0);
  EXPECT_EQ(ref({0, std::log(0.5f), -20}, {.temperature = 1.0f, .min_p = 0.4f, .uniform = 0.99}),
            1);
}

TEST(Sampling, FrequenciesFollowTheSoftmax) {
  const std::vector<float> logits{1.0f, 0.0f, 2.0f, -1.0f, 2.0f};
  const float t = 0.7f;
  std::vector<double> p(logits.size());
  double z = 0;
  for (size_t i = 0; i < p.size(); ++i) z += (p[i] = std::exp(logits[i] / t));
  SamplerRng rng(3);
  std::vector<int> hits(logits.size());
  const int n = 20000;
  std::vector<std::pair<float, int32_t>> scratch;
  for (int i = 0; i < n; ++i)
    ++hits[size_t(sample_token(logits.data(), 5, {.temperature = t}, rng, scratch))];
  for (size_t i = 0; i < p.size(); ++i) {
    const double want = p[i] / z, sd = std::sqrt(want * (1 - want) / n);
    EXPECT_NEAR(double(hits[i]) / n, want, 5 * sd) << "token " << i;
  }
}

}  // namespace
}  // namespace strata
