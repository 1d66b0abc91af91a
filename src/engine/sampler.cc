#include "engine/sampler.h"

#include <algorithm>
#include <cmath>

namespace strata {

namespace {
int32_t argmax(const float* logits, int64_t vocab) {
  return int32_t(std::max_element(logits, logits + vocab) - logits);
}
}  // namespace

int32_t sample_token(const float* logits, int64_t vocab, const SampleConfig& cfg, SamplerRng& rng,
                     std::vector<std::pair<float, int32_t>>& scratch) {
  if (cfg.temperature <= 0.0f || cfg.top_k == 1) return argmax(logits, vocab);
  // Candidates sorted by logit, descending; top-k limits how many we sort.
  const int64_t k = (cfg.top_k > 0 && cfg.top_k < vocab) ? cfg.top_k : vocab;
  scratch.resize(size_t(vocab));
  for (int64_t i = 0; i < vocab; ++i) scratch[size_t(i)] = {logits[i], int32_t(i)};
  auto by_logit = [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  };
  std::partial_sort(scratch.begin(), scratch.begin() + k, scratch.end(), by_logit);
  scratch.resize(size_t(k));
  // Softmax at temperature over the candidates.
  const float max_logit = scratch[0].first;
  double total = 0;
  for (auto& [v, id] : scratch) {
    v = float(std::exp(double(v - max_logit) / cfg.temperature));
    total += v;
  }
  // min-p: drop tokens below min_p × the top probability; top-p: smallest prefix whose mass
  // reaches top_p.
  size_t keep = scratch.size();
  if (cfg.min_p > 0) {
    const float floor_p = scratch[0].first * cfg.min_p;
    keep = size_t(std::find_if(scratch.begin(), scratch.end(),
                               [&](const auto& c) { return c.first < floor_p; }) -
                  scratch.begin());
  }
  if (cfg.top_p < 1.0f) {
    double mass = 0;
    for (size_t i = 0; i < keep; ++i) {
      mass += scratch[i].first / total;
      if (mass >= cfg.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  keep = std::max<size_t>(keep, 1);
  double kept = 0;
  for (size_t i = 0; i < keep; ++i) kept += scratch[i].first;
  double r = rng.uniform() * kept;
  for (size_t i = 0; i < keep; ++i) {
    r -= scratch[i].first;
    if (r < 0) return scratch[i].second;
  }
  return scratch[keep - 1].second;
}

TokenLogprobs token_logprobs(const float* logits, int64_t vocab, int32_t chosen, int top_n) {
  const float max_logit = *std::max_element(logits, logits + vocab);
  double sum = 0;
  for (int64_t i = 0; i < vocab; ++i) sum += std::exp(double(logits[i] - max_logit));
  const double log_z = double(max_logit) + std::log(sum);
  TokenLogprobs out;
  out.logprob = float(double(logits[chosen]) - log_z);
  if (top_n > 0) {
    std::vector<int32_t> idx(static_cast<size_t>(vocab));
    for (int64_t i = 0; i < vocab; ++i) idx[size_t(i)] = int32_t(i);
    const int64_t n = std::min<int64_t>(top_n, vocab);
    std::partial_sort(idx.begin(), idx.begin() + n, idx.end(), [&](int32_t a, int32_t b) {
      return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
    });
    for (int64_t i = 0; i < n; ++i)
      out.top.push_back({idx[size_t(i)], float(double(logits[idx[size_t(i)]]) - log_z)});
  }
  return out;
}

}  // namespace strata
