#include "engine/logit_edits.h"

#include <algorithm>

namespace strata {

void append_logit_edits(const SamplingParams& p, const OutputTokenCounts& counts, int32_t row,
                        std::vector<LogitEdit>* out) {
  const auto& bias = p.logit_bias;  // sorted by token id
  auto bias_of = [&](int32_t token) {
    auto it = std::lower_bound(bias.begin(), bias.end(), token,
                               [](const auto& b, int32_t t) { return b.first < t; });
    return it != bias.end() && it->first == token ? it->second : 0.0f;
  };
  const bool penalized =
      p.repetition_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f;
  if (penalized) {
    for (const auto& [token, n] : counts.counts()) {
      out->push_back(LogitEdit{
          .row = row,
          .token = token,
          .subtract = float(double(p.presence_penalty) + double(p.frequency_penalty) * double(n)),
          .scale = p.repetition_penalty,
          .bias = bias_of(token)});
    }
  }
  for (const auto& [token, b] : bias) {
    if (penalized && counts.count(token) > 0) continue;  // merged above
    out->push_back(LogitEdit{.row = row, .token = token, .bias = b});
  }
}

}  // namespace strata
