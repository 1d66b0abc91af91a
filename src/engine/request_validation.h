// The one request contract: every check of a generation request's values, each failure a
// RequestError naming the field at fault (by its OpenAI name) in one wording. Engine::submit runs
// validate_request on everything it is given; the server runs validate_sampling on the parsed
// body too, so a bad value is refused before the prompt is tokenized, with the same error.
// Pure functions, thread-safe.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "engine/request_error.h"
#include "engine/sampling_params.h"

namespace strata {

// Accepted ranges (SGLang's and OpenAI's).
inline constexpr float kMaxTemperature = 2.0f;
inline constexpr float kMaxPenalty = 2.0f;            // presence and frequency: [-2, 2]
inline constexpr float kMaxRepetitionPenalty = 2.0f;  // (0, 2]
inline constexpr float kMaxLogitBias = 100.0f;        // [-100, 100]

// What an engine can hold (Engine::request_limits).
struct RequestLimits {
  int64_t vocab_size = 0;          // token ids must be below it; 0: not known (not checked)
  int64_t context_length = 0;      // the model's (or --context-length)
  int64_t kv_capacity_tokens = 0;  // the KV pool: a request must fit it whole, never be cut short
  // The longest prompt + completion: the smaller of the two.
  int64_t max_request_tokens() const { return std::min(context_length, kv_capacity_tokens); }
  // "" when the model's context is the limit, else " (the KV cache pool holds N tokens, less than
  // the model's M: ...the flags that give it more room)".
  std::string limit_reason() const;
};

// The sampling values alone: ranges, and token ids (logit_bias) against `vocab_size` when it is
// known (> 0). max_new_tokens must be >= 1.
std::optional<RequestError> validate_sampling(const SamplingParams& params, int64_t vocab_size = 0);

// A whole request: its sampling values, its prompt (non-empty, ids in the vocabulary), and that
// prompt + max_new_tokens fits `limits` (context_length_exceeded otherwise: refused rather than
// cut short). `resume_output_ids` (a resumed generation's output so far) must be in the
// vocabulary and leave something to generate.
std::optional<RequestError> validate_request(std::span<const int32_t> prompt_ids,
                                             const SamplingParams& params,
                                             std::span<const int32_t> resume_output_ids,
                                             const RequestLimits& limits);

}  // namespace strata
