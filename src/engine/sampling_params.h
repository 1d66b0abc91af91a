// SamplingParams: how one request's tokens are chosen and when it stops, the one struct from a
// request to the sampler. The server fills it from the OpenAI request (server/openai_schema.cc),
// `strata generate` from its flags (tools/generate_main.cc); the engine turns it into each
// token's SampleRowParams (engine/sampler.h) and logit edits (engine/logit_edits.h). Its values
// are checked in one place, validate_sampling (engine/request_validation.h); this is plain data.
// The defaults are the OpenAI API's (temperature 1); `strata generate` defaults to greedy.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace strata {

struct SamplingParams {
  float temperature = 1.0f;  // [0, 2]; 0 means greedy
  float top_p = 1.0f;        // (0, 1]; 1 disables nucleus filtering
  int32_t top_k = -1;        // -1 (or 0) disables top-k; 1 is greedy
  float min_p = 0.0f;        // [0, 1]: drops tokens below min_p x the most likely one's probability
  // Penalties on the tokens this request has generated so far (its output, as in SGLang; the
  // prompt does not count), applied to the logits before sampling (engine/logit_edits.h).
  float repetition_penalty =
      1.0f;  // (0, 2]; 1: off. Positive logits divided by it, negative multiplied
  float presence_penalty = 0.0f;   // [-2, 2]: subtracted once from every generated token's logit
  float frequency_penalty = 0.0f;  // [-2, 2]: subtracted once per occurrence
  // OpenAI's logit_bias: (token id, value in [-100, 100]) added to that token's logit after the
  // penalties. Sorted by token id, one entry per id.
  std::vector<std::pair<int32_t, float>> logit_bias{};
  std::optional<uint64_t> seed{};  // per-request RNG seed; unset: the engine's stream
  int32_t max_new_tokens = 128;
  // Until the output holds this many tokens, the stop tokens (stop_token_ids, and the model's
  // EOS unless ignore_eos) cannot be sampled (their logits set to -inf: engine/logit_edits.h)
  // and stop strings are not looked for: vLLM's min_tokens, SGLang's min_new_tokens. [0, max].
  int32_t min_new_tokens = 0;
  std::vector<int32_t> stop_token_ids{};    // finish (reason stop) when one of these is sampled
  std::vector<std::string> stop_strings{};  // checked by the engine on the detokenized text
  // The matched stop string ends the text (vLLM's include_stop_str_in_output); else it is cut.
  bool include_stop_str_in_output = false;
  bool ignore_eos = false;  // when true the model's EOS tokens do not finish the request

  // Whether the logits are changed before sampling (a penalty or a bias is set).
  bool edits_logits() const {
    return repetition_penalty != 1.0f || presence_penalty != 0.0f || frequency_penalty != 0.0f ||
           !logit_bias.empty();
  }
};

}  // namespace strata
