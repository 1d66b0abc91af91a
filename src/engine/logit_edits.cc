#include "engine/logit_edits.h"

#include <algorithm>
#include <limits>

namespace strata {

void append_logit_edits(const SamplingParams& p, const OutputTokenCounts& counts, int32_t row,
                        std::span<const int32_t> banned, std::vector<LogitEdit>* out) {
  const size_t first = out->size();
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
  // A few tokens (the stop and EOS ids): a linear search of this row's edits each.
  for (int32_t token : banned) {
    auto it = std::find_if(out->begin() + std::ptrdiff_t(first), out->end(),
                           [&](const LogitEdit& e) { return e.token == token; });
    if (it == out->end()) it = out->insert(out->end(), LogitEdit{.row = row, .token = token});
    it->bias = -std::numeric_limits<float>::infinity();
  }
}

void min_tokens_banned(const SamplingParams& p, int32_t position, std::span<const int32_t> eos_ids,
                       std::vector<int32_t>* out) {
  out->clear();
  if (position >= p.min_new_tokens) return;
  out->assign(p.stop_token_ids.begin(), p.stop_token_ids.end());
  if (!p.ignore_eos) out->insert(out->end(), eos_ids.begin(), eos_ids.end());
}

}  // namespace strata
