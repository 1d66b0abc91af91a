// /tokenize and /detokenize (SGLang's and vLLM's, also under /v1/): the server's own tokenizer and
// chat template on text, token ids and conversations, so clients count and cut prompts with the
// exact tokens the engine will see.
//
// /tokenize {"prompt": text or [texts], "add_special_tokens": true} or {"messages": [...],
// "add_generation_prompt": true, "tools": ...} -> {"tokens", "count", "max_model_len"} (lists for
// a list of prompts). /detokenize {"tokens": ids or [ids], "skip_special_tokens": true} ->
// {"text"} (SGLang's key) and {"prompt"} (vLLM's), the same value.
#pragma once

#include <nlohmann/json.hpp>
#include <string_view>
#include <variant>

#include "server/openai_schema.h"
#include "server/server_state.h"

namespace strata {

// The response body, or the error to answer.
std::variant<ApiError, nlohmann::json> tokenize_request(ServerState& state, std::string_view body);
std::variant<ApiError, nlohmann::json> detokenize_request(ServerState& state,
                                                          std::string_view body);

}  // namespace strata
