// Token sampling: greedy at temperature 0, else temperature, top-k, top-p (nucleus) and min-p
// filtering, drawn from a per-request seeded generator so a request's output depends only on its
// seed, never on the batch it ran in. The rules are backend.h's SampleRowParams: the engine draws
// each row's uniform here (draw_row_params, from the request's SamplingParams) and a backend
// samples the rows where the logits are (Backend::sample, on the GPU for CUDA), after the
// penalties and logit_bias changed them (engine/logit_edits.h); sample_token does both on the host.
#pragma once

#include <cstdint>
#include <deque>
#include <random>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "engine/sampling_params.h"

namespace strata {

// Per-request random stream (seeded once; advanced one draw per sampled token). Its whole state
// is (seed, draws): a generation resumed from a checkpoint restores it with SamplerRng(seed,
// draws) and continues exactly as the uninterrupted stream would (cost: `draws` steps).
// peek(i) looks at the draw i places ahead without taking it: a speculative verify step samples
// its rows for output positions n, n+1, ... with the draws those positions would get in plain
// decoding, and takes only the ones of the tokens it keeps (engine/spec/verify.h).
class SamplerRng {
 public:
  explicit SamplerRng(uint64_t seed, uint64_t draws = 0) : gen_(seed), draws_(draws) {
    gen_.discard(draws);
  }
  // Uniform in [0, 1).
  double uniform() {
    ++draws_;
    if (ahead_.empty()) return next();
    const double u = ahead_.front();
    ahead_.pop_front();
    return u;
  }
  // The draw `i` places ahead (0: what uniform() returns next), not taken.
  double peek(size_t i) {
    while (ahead_.size() <= i) ahead_.push_back(next());
    return ahead_[i];
  }
  // Draws taken since the seed (what a checkpoint stores).
  uint64_t draws() const { return draws_; }

 private:
  double next() { return double(gen_() >> 11) * 0x1.0p-53; }
  std::mt19937_64 gen_;
  uint64_t draws_ = 0;
  std::deque<double> ahead_;  // drawn from gen_ by peek(), not yet taken
};

// The row parameters of one token: the request's temperature, top_p, top_k and min_p plus, unless
// greedy, one draw from `rng` (the stream advances exactly one draw per sampled token, none per
// greedy one).
SampleRowParams draw_row_params(const SamplingParams& params, SamplerRng& rng);
// The same with the draw `ahead` places ahead, not taken (rng.peek): the caller takes it
// (rng.uniform()) when the row's token is kept. Greedy rows look at no draw.
SampleRowParams peek_row_params(const SamplingParams& params, SamplerRng& rng, size_t ahead);

// Picks the next token on the host (draw_row_params + sample_row_reference) from logits the
// penalties and logit_bias have already changed. `scratch` is reused between calls to avoid
// allocation.
int32_t sample_token(const float* logits, int64_t vocab, const SamplingParams& params,
                     SamplerRng& rng, std::vector<std::pair<float, int32_t>>& scratch);

// Log-probabilities under the model's distribution (log_softmax of the raw logits).
struct TokenLogprobs {
  float logprob = 0;                           // of the chosen token
  std::vector<std::pair<int32_t, float>> top;  // the `top_n` most likely, descending
};
TokenLogprobs token_logprobs(const float* logits, int64_t vocab, int32_t chosen, int top_n);

}  // namespace strata
