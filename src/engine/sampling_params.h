// Per-request sampling parameters, as parsed from an OpenAI request or a generate job.
// Validation of user values (ranges) happens where they are parsed; this is plain data.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace strata {

struct SamplingParams {
  float temperature = 1.0f;  // 0 means greedy
  float top_p = 1.0f;        // 1 disables nucleus filtering
  int32_t top_k = -1;        // -1 (or 0) disables top-k
  std::optional<uint64_t> seed{};  // per-request RNG seed; unset: the engine's stream
  int32_t max_new_tokens = 128;
  std::vector<int32_t> stop_token_ids{};  // finish (reason stop) when one of these is sampled
  std::vector<std::string> stop_strings{};  // checked by the engine on the detokenized text
  bool ignore_eos = false;  // when true the model's EOS tokens do not finish the request
};

}  // namespace strata
