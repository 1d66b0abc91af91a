#include "engine/request_validation.h"

#include <cmath>

namespace strata {

Status RequestError::to_status() const {
  switch (code) {
    case RequestErrorCode::kInvalidValue:
      return Status(StatusCode::kInvalidArgument, describe());
    case RequestErrorCode::kContextLengthExceeded:
      return Status(StatusCode::kOutOfRange, describe());
    case RequestErrorCode::kUnsupported:
      return Status(StatusCode::kUnimplemented, describe());
    case RequestErrorCode::kUnavailable:
      return Status(StatusCode::kUnavailable, describe());
  }
  return Status(StatusCode::kInternal, describe());
}

std::string RequestLimits::limit_reason() const {
  if (kv_capacity_tokens >= context_length) return "";
  return fmt::format(
      " (the KV cache pool holds {} tokens, less than the model's {}: raise --max-total-tokens, "
      "--mem-fraction-static or, on cpu, --device-memory-gib)",
      kv_capacity_tokens, context_length);
}

namespace {

constexpr auto kInvalid = RequestErrorCode::kInvalidValue;
constexpr auto kTooLong = RequestErrorCode::kContextLengthExceeded;

// `v` within [lo, hi] (finite).
std::optional<RequestError> check_range(const char* param, float v, float lo, float hi) {
  if (std::isfinite(v) && v >= lo && v <= hi) return std::nullopt;
  return invalid_value(param, "must be between {} and {}, got {}", lo, hi, v);
}

}  // namespace

std::optional<RequestError> validate_sampling(const SamplingParams& p, int64_t vocab_size) {
  if (auto e = check_range("temperature", p.temperature, 0.0f, kMaxTemperature)) return e;
  if (!(std::isfinite(p.top_p) && p.top_p > 0.0f && p.top_p <= 1.0f))
    return invalid_value("top_p", "must be greater than 0 and at most 1, got {}", p.top_p);
  if (p.top_k < -1)
    return invalid_value("top_k", "must be -1 or 0 (off) or a number of tokens, got {}", p.top_k);
  if (auto e = check_range("min_p", p.min_p, 0.0f, 1.0f)) return e;
  if (!(std::isfinite(p.repetition_penalty) && p.repetition_penalty > 0.0f &&
        p.repetition_penalty <= kMaxRepetitionPenalty))
    return invalid_value("repetition_penalty",
                         "must be greater than 0 and at most {} (1 is off), got {}",
                         kMaxRepetitionPenalty, p.repetition_penalty);
  if (auto e = check_range("presence_penalty", p.presence_penalty, -kMaxPenalty, kMaxPenalty))
    return e;
  if (auto e = check_range("frequency_penalty", p.frequency_penalty, -kMaxPenalty, kMaxPenalty))
    return e;
  for (size_t i = 0; i < p.logit_bias.size(); ++i) {
    const auto [id, bias] = p.logit_bias[i];
    if (id < 0 || (vocab_size > 0 && id >= vocab_size))
      return invalid_value("logit_bias", "names token id {}, outside the vocabulary{}", id,
                           vocab_size > 0 ? fmt::format(" (size {})", vocab_size) : "");
    if (i > 0 && p.logit_bias[i - 1].first >= id)
      return invalid_value("logit_bias", "names token id {} twice", id);
    if (!(std::isfinite(bias) && bias >= -kMaxLogitBias && bias <= kMaxLogitBias))
      return invalid_value("logit_bias", "values must be between {} and {}, got {} for token {}",
                           -kMaxLogitBias, kMaxLogitBias, bias, id);
  }
  for (int32_t id : p.stop_token_ids)
    if (id < 0) return invalid_value("stop_token_ids", "holds {}, not a token id", id);
  if (p.max_new_tokens < 1)
    return invalid_value("max_tokens", "must be >= 1, got {}", p.max_new_tokens);
  if (p.min_new_tokens < 0 || p.min_new_tokens > p.max_new_tokens)
    return invalid_value("min_tokens", "must be between 0 and max_tokens ({}), got {}",
                         p.max_new_tokens, p.min_new_tokens);
  return std::nullopt;
}

std::optional<RequestError> validate_request(std::span<const int32_t> prompt,
                                             const SamplingParams& p,
                                             std::span<const int32_t> resumed,
                                             const RequestLimits& limits) {
  if (auto e = validate_sampling(p, limits.vocab_size)) return e;
  if (prompt.empty()) return request_error(kInvalid, "prompt", "the prompt has no tokens");
  const int64_t vocab = limits.vocab_size;
  for (int32_t id : prompt)
    if (id < 0 || (vocab > 0 && id >= vocab))
      return request_error(kInvalid, "prompt",
                           "token id {} in the prompt is outside the vocabulary (size {})", id,
                           vocab);
  for (int32_t id : resumed)
    if (id < 0 || (vocab > 0 && id >= vocab))
      return request_error(kInvalid, "", "resumed token id {} is outside the vocabulary (size {})",
                           id, vocab);
  if (int64_t(resumed.size()) >= p.max_new_tokens)
    return request_error(kInvalid, "",
                         "a resumed generation of {} tokens has nothing left to generate "
                         "(max_tokens {})",
                         resumed.size(), p.max_new_tokens);
  // Refused rather than cut short: the scheduler would otherwise finish it at the pool's size.
  const int64_t n = int64_t(prompt.size()), limit = limits.max_request_tokens();
  if (n >= limit)
    return request_error(kTooLong, "prompt",
                         "This model's maximum context length is {} tokens{}. However, your "
                         "prompt has {} tokens, leaving no room for the completion.",
                         limit, limits.limit_reason(), n);
  if (n + p.max_new_tokens > limit)
    return request_error(kTooLong, "max_tokens",
                         "This model's maximum context length is {} tokens{}. However, you "
                         "requested {} tokens ({} in the prompt, {} for the completion).",
                         limit, limits.limit_reason(), n + p.max_new_tokens, n, p.max_new_tokens);
  return std::nullopt;
}

}  // namespace strata
