// SGLang's native /generate API (SGLang's GenerateReqInput), for the clients and tools written
// against it: SGLang's bench_serving (`--backend sglang`, its default), its own scripts and the
// data pipelines that post `{"text", "sampling_params"}`.
//
// A request is translated into the completions request it means (text or input_ids as the
// prompt, sampling_params' fields under their OpenAI names) and validated by the same code
// (openai_schema.h), so every value means and is checked exactly as there; errors name the
// native fields (`sampling_params.max_new_tokens`). The response is SGLang's: per prompt and
// choice `{"text", "output_ids", "meta_info": {"id", "finish_reason": {"type": "stop" | "length"
// | "abort", ...}, "prompt_tokens", "completion_tokens", "cached_tokens", "e2e_latency"}}`, one
// object for one prompt and choice, else a list; streamed as SSE events whose "text" is the whole
// text so far (as SGLang sends it), then `data: [DONE]`. With return_logprob, meta_info carries
// output_token_logprobs / output_top_logprobs, and with logprob_start_len >= 0 the prompt's
// from that token on as input_token_logprobs / input_top_logprobs (token 0's logprob null);
// max_new_tokens 0 runs the prefill alone (no output: finish_reason length 0).
// Refused (never ignored): images, LoRA, embeddings as input, sessions, disaggregation,
// token_ids_logprob and everything the completions API refuses.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "server/openai_schema.h"

namespace strata {

// Parses a /generate body into *out (endpoint kGenerate). Errors as parse_openai_request's, with
// the native parameter names.
std::optional<ApiError> parse_generate_request(std::string_view body, OpenAiRequest* out);

// What one choice has to say beside its text and tokens.
struct GenerateChoiceMeta {
  std::string id;  // the request's rid (suffixed per choice when there are several), else made
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;
  double e2e_latency_s = 0;
};

// One choice's object; `c.finish_reason` kNone while it runs (streamed events).
nlohmann::json build_generate_item(const OpenAiRequest& req, const ChoiceResult& c,
                                   const GenerateChoiceMeta& meta, const Tokenizer& tok, int index);

}  // namespace strata
