// Tool calling in the chat API (OpenAI's `tools`, `tool_choice`, `parallel_tool_calls`; messages'
// `tool_calls` and `tool_call_id`): the request side (validation, what the chat template sees) and
// the response side (calls parsed by --tool-call-parser, tokenizer/tool_call_parser.h, as
// `tool_calls` with ids). Pure functions, as openai_schema.h.
//
// What the chat template sees: `tools` as the client sent them ({"type": "function", "function":
// {...}}, key order kept: templates print them with tojson), as Hugging Face's
// apply_chat_template(tools=...) passes them; an assistant message's tool_calls with their
// arguments parsed into objects (templates print them with tojson, as vLLM and SGLang pass them).
// tool_choice "none" leaves the tools out of the prompt and the output unparsed (SGLang).
// "required" and a named function need constrained decoding and are refused.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "tokenizer/tool_call_parser.h"

namespace strata {

struct ApiError;
struct OpenAiRequest;

// The request's tool fields (chat only; none of them on /v1/completions). `ordered_body` is the
// body parsed keeping key order (null when the request has no tools).
std::optional<ApiError> parse_tools(const nlohmann::json& body,
                                    const nlohmann::ordered_json& ordered_body, OpenAiRequest* r);

// One assistant message's tool_calls (param: "messages[i].tool_calls"), normalized into *out with
// the arguments parsed (an arguments string that is no JSON stays a string).
std::optional<ApiError> parse_message_tool_calls(const nlohmann::json& calls,
                                                 const std::string& param,
                                                 nlohmann::ordered_json* out);

// The chat template's variables for the request: chat_template_kwargs, and `tools` when the
// request offers them (tool_choice other than "none").
nlohmann::ordered_json chat_template_context(const OpenAiRequest& r);

// Whether the output of this request is parsed for tool calls (it offers tools and did not say
// "none"; the server has a parser).
bool wants_tool_calls(const OpenAiRequest& r);

// delta.tool_calls (streamed: each call with its index in the choice; message.tool_calls is
// tool_calls_json, tokenizer/tool_call_parser.h).
nlohmann::json tool_call_deltas_json(const std::vector<ApiToolCall>& calls, int first_index);

}  // namespace strata
