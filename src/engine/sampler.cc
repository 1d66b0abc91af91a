#include "engine/sampler.h"

#include <algorithm>
#include <cmath>

namespace strata {

SampleRowParams draw_row_params(const SamplingParams& params, SamplerRng& rng) {
  SampleRowParams p{.temperature = params.temperature,
                    .top_p = params.top_p,
                    .top_k = params.top_k,
                    .min_p = params.min_p,
                    .uniform = 0.0};
  if (!sample_is_greedy(p)) p.uniform = rng.uniform();
  return p;
}

SampleRowParams peek_row_params(const SamplingParams& params, SamplerRng& rng, size_t ahead) {
  SampleRowParams p{.temperature = params.temperature,
                    .top_p = params.top_p,
                    .top_k = params.top_k,
                    .min_p = params.min_p,
                    .uniform = 0.0};
  if (!sample_is_greedy(p)) p.uniform = rng.peek(ahead);
  return p;
}

int32_t sample_token(const float* logits, int64_t vocab, const SamplingParams& params,
                     SamplerRng& rng, std::vector<std::pair<float, int32_t>>& scratch) {
  return sample_row_reference(logits, vocab, draw_row_params(params, rng), scratch);
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
