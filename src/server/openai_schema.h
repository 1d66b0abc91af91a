// The OpenAI wire format: parse and validate /v1/completions and /v1/chat/completions request
// bodies into OpenAiRequest, and build the response, streaming chunk and error JSON.
// Pure functions (no engine, no HTTP): unit-testable and thread-safe.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/engine.h"
#include "server/openai_tools.h"

namespace strata {

// An OpenAI-shaped error: {"error": {"message", "type", "param", "code"}} with an HTTP status.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // empty: null
  std::string code;   // empty: null
  nlohmann::json to_json() const;
};
ApiError api_error(int status, std::string message, std::string type, std::string param = "",
                   std::string code = "");
// 400 invalid_request_error.
ApiError bad_request(std::string message, std::string param = "", std::string code = "");
// 5xx server_error (503 responses also carry Retry-After).
ApiError server_error(int status, std::string message, std::string code = "");

// kGenerate: SGLang's native /generate (server/sglang_generate.h), a completions request in
// another wire format.
enum class Endpoint { kCompletions, kChat, kGenerate };

struct OpenAiRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;  // empty: the served model
  // chat: [{role, content (string), ...}]; ordered: the template may print parts with tojson.
  nlohmann::ordered_json messages;
  std::vector<std::string> text_prompts;            // completions: one per prompt
  std::vector<std::vector<int32_t>> token_prompts;  // completions given token ids
  int n = 1;
  std::optional<int32_t> max_tokens;  // unset: completions 16, chat the rest of the context
  // Every sampling field (OpenAI's and SGLang's extensions: top_k, min_p, repetition_penalty,
  // stop_token_ids, ignore_eos); max_new_tokens is set per prompt when submitted, and choice i
  // of n draws with seed + i.
  SamplingParams sampling;
  // chat: extra variables for the chat template (SGLang's chat_template_kwargs, e.g.
  // {"enable_thinking": false}); a JSON object or null.
  nlohmann::json chat_template_kwargs;
  // chat: the template's generation prompt (false: the conversation as it stands), or vLLM's
  // continue_final_message: the final assistant message left open and continued
  // (PromptEncoder::encode_chat_continuing; it needs add_generation_prompt false, as vLLM's).
  bool add_generation_prompt = true;
  bool continue_final_message = false;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  // SGLang's return_meta_info: usage then also carries speculative decoding's per-request counts
  // (spec_verify_ct, spec_draft_token_num, spec_accept_token_num, spec_accept_length).
  bool return_meta_info = false;
  int top_logprobs = -1;  // -1: no logprobs; else the chosen token's and the top n
  // Completions' echo: each choice's text (and, with logprobs, its logprobs) starts with its
  // prompt's; max_tokens 0 then asks for the prompt alone (prompt_only: one token is sampled and
  // dropped, finish_reason "length"). Chat refuses echo.
  bool echo = false;
  bool prompt_only = false;
  // The prompt's logprobs from this token on (GenerateRequest::prompt_logprobs_from): echo with
  // logprobs 0, /generate's logprob_start_len; -1 none.
  int32_t prompt_logprobs_from = -1;
  // Chat with --reasoning-parser (SGLang's fields): split the reasoning out of the content, and
  // stream it as it comes (false: in one delta once it ended).
  bool separate_reasoning = true;
  bool stream_reasoning = true;
  bool skip_special_tokens = true;  // SGLang's field: false puts special tokens' text in the output
  // Chat tools (server/openai_tools.h): the offered tools as sent (null: none), tool_choice
  // "none", parallel_tool_calls, and the calls the conversation's assistant messages made (Kimi
  // K2's ids count them).
  nlohmann::ordered_json tools;
  bool tool_choice_none = false;
  bool parallel_tool_calls = true;
  int history_tool_calls = 0;
  // /generate: the prompts came as a list (the response is a list), the client's request ids
  // (rid: one, or one per prompt), and token texts in its logprobs.
  bool native_batch = false;
  std::vector<std::string> rids;
  bool text_in_logprobs = false;
  int num_prompts() const {
    return endpoint == Endpoint::kChat ? 1 : int(text_prompts.size() + token_prompts.size());
  }
};

// The request's Content-Type must declare JSON: application/json or a +json type, parameters
// (charset) allowed, case-insensitive. A request without one is accepted (some clients send
// none); any other type (text/plain, a form) is answered 415 naming what was sent.
std::optional<ApiError> check_json_content_type(std::string_view content_type);

// A boolean field of `body` into *out: absent or null leaves it unchanged, another type is an
// error naming the field.
std::optional<ApiError> read_bool(const nlohmann::json& body, const char* key, bool* out);

// The body as a JSON value: errors for invalid UTF-8, nesting too deep and malformed JSON.
std::optional<ApiError> parse_json_body(std::string_view body, nlohmann::json* out);

// Parses `body`. Returns an error for malformed JSON, invalid UTF-8, wrong types, parameters this
// server refuses, and sampling values the request contract refuses (validate_sampling); the model
// name, the prompt and the context length are checked by the caller (they need the engine).
std::optional<ApiError> parse_openai_request(std::string_view body, Endpoint endpoint,
                                             OpenAiRequest* out);

// The OpenAI error for a refused request (engine/request_error.h): 400 with `param` naming the
// field (code context_length_exceeded / unsupported_parameter where they apply), 503 while the
// engine shuts down. `prompt_param` replaces the param "prompt" (chat requests: "messages").
ApiError api_error_from(const RequestError& error, const std::string& prompt_param = "prompt");

// What one choice produced.
struct ChoiceResult {
  std::string text;
  std::optional<std::string> reasoning;  // set: a chat response with reasoning_content (text: the
                                         // content, without the reasoning)
  std::vector<ApiToolCall> tool_calls;   // chat with --tool-call-parser (text: the rest)
  std::vector<int32_t> token_ids;
  std::vector<TokenLogprobs> logprobs;               // one per token when requested
  FinishReason finish_reason = FinishReason::kNone;  // a stop after tool calls is "tool_calls"
  std::string error;
  // OpenAiRequest::echo: the prompt's text, written before text; and the prompt's ids (echo and
  // prompt logprobs: the tokens they score).
  std::string echo_text;
  std::vector<int32_t> prompt_ids;
  // OpenAiRequest::prompt_logprobs_from: the logprobs of prompt tokens prompt_logprobs_from..
  // (StreamEvent::prompt_logprobs; the tokens before have none: null in the response).
  std::vector<TokenLogprobs> prompt_logprobs;
  int32_t prompt_logprobs_from = 0;
};

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;
  // Speculative decoding (OpenAiRequest::return_meta_info; SGLang's meta_info names), summed over
  // the choices: verifies, drafts proposed, drafts accepted.
  bool include_spec = false;
  int64_t spec_verify_ct = 0;
  int64_t spec_draft_token_num = 0;
  int64_t spec_accept_token_num = 0;
  nlohmann::json to_json() const;
};

// Identity fields shared by a response and its chunks.
struct ResponseMeta {
  std::string id;       // cmpl-… / chatcmpl-…
  int64_t created = 0;  // unix seconds
  std::string model;
};

// The non-streaming response body.
nlohmann::json build_response(const OpenAiRequest& req, const ResponseMeta& meta,
                              const std::vector<ChoiceResult>& choices, const Usage& usage,
                              const Tokenizer& tok);

// One streaming chunk for one choice: new text (and its tokens' logprobs); `finish` set on the
// last one. `first` adds the chat role delta. `text_offset` is the choice's text length before
// this chunk (completions logprobs).
struct ChunkPart {
  int choice = 0;
  bool first = false;
  std::string text;
  std::string reasoning;                // chat: the delta's reasoning_content (none when empty)
  std::vector<ApiToolCall> tool_calls;  // chat: calls completed in this delta,
  int tool_index = 0;                   // the first one's index in the choice
  bool called_tools = false;            // with finish: the choice made calls ("tool_calls")
  std::vector<int32_t> token_ids;
  std::vector<TokenLogprobs> logprobs;  // of token_ids from the `unscored`-th (null before it)
  size_t unscored = 0;                  // echo: the prompt's first tokens have no logprob
  std::optional<FinishReason> finish;
  size_t text_offset = 0;
};
nlohmann::json build_chunk(const OpenAiRequest& req, const ResponseMeta& meta,
                           const ChunkPart& part, const Tokenizer& tok);
// The final usage-only chunk (stream_options.include_usage).
nlohmann::json build_usage_chunk(const OpenAiRequest& req, const ResponseMeta& meta,
                                 const Usage& usage);

// Of an echoed prompt of prompt_len tokens, how many lead without a logprob (null): those before
// `from` (the engine's first scored token) when num_logprobs covers the rest, else all of them
// (the choice ended before its prompt's logprobs came).
size_t unscored_prompt_tokens(size_t prompt_len, size_t num_logprobs, int32_t from);

// "stop" or "length" (kAbort too: OpenAI has no "abort"); null for kNone.
nlohmann::json finish_reason_json(FinishReason r);

}  // namespace strata
