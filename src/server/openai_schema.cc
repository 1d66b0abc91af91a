#include "server/openai_schema.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cfloat>
#include <cmath>

#include "core/json_limits.h"
#include "tokenizer/utf8.h"

namespace strata {
namespace {

using nlohmann::json;

constexpr int kMaxN = 128;
constexpr int kMaxTopLogprobs = 20;
constexpr size_t kMaxStops = 16;

const char* type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::boolean:
      return "boolean";
    case json::value_t::string:
      return "string";
    case json::value_t::array:
      return "array";
    case json::value_t::object:
      return "object";
    case json::value_t::number_float:
      return "number";
    default:
      return "integer";
  }
}

ApiError wrong_type(const std::string& param, const char* want, const json& got) {
  return bad_request(fmt::format("'{}' must be {}, got {}", param, want, type_name(got)), param);
}

// Field readers: absent or null leaves *out unchanged; a wrong type is an error.
std::optional<ApiError> read_number(const json& b, const char* key, double lo, double hi,
                                    double* out) {
  auto it = b.find(key);
  if (it == b.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) return wrong_type(key, "a number", *it);
  const double v = it->get<double>();
  if (!std::isfinite(v) || v < lo || v > hi)
    return bad_request(fmt::format("'{}' must be between {} and {}, got {}", key, lo, hi, v), key);
  *out = v;
  return std::nullopt;
}

std::optional<ApiError> read_int(const json& b, const char* key, int64_t lo, int64_t hi,
                                 std::optional<int64_t>* out) {
  auto it = b.find(key);
  if (it == b.end() || it->is_null()) return std::nullopt;
  if (!it->is_number_integer() &&
      !(it->is_number_float() && it->get<double>() == std::floor(it->get<double>())))
    return wrong_type(key, "an integer", *it);
  const double d = it->get<double>();
  if (d < double(lo) || d > double(hi))
    return bad_request(
        fmt::format("'{}' must be between {} and {}, got {}", key, lo, hi, it->dump()), key);
  *out = it->is_number_unsigned() ? int64_t(it->get<uint64_t>()) : it->get<int64_t>();
  return std::nullopt;
}

std::optional<ApiError> read_string(const json& b, const char* key, std::string* out) {
  auto it = b.find(key);
  if (it == b.end() || it->is_null()) return std::nullopt;
  if (!it->is_string()) return wrong_type(key, "a string", *it);
  *out = it->get<std::string>();
  return std::nullopt;
}

std::optional<ApiError> read_token_ids(const json& v, const std::string& param,
                                       std::vector<int32_t>* out) {
  for (const auto& t : v) {
    if (!t.is_number_integer()) return wrong_type(param, "an array of token ids (integers)", t);
    const int64_t id = t.get<int64_t>();
    if (id < 0 || id > INT32_MAX)
      return bad_request(fmt::format("token id {} in '{}' is out of range", id, param), param);
    out->push_back(int32_t(id));
  }
  return std::nullopt;
}

// prompt: string | [string] | [int] | [[int]].
std::optional<ApiError> parse_prompt(const json& b, OpenAiRequest* r) {
  auto it = b.find("prompt");
  if (it == b.end() || it->is_null()) return bad_request("'prompt' is required", "prompt");
  const json& p = *it;
  if (p.is_string()) {
    r->text_prompts.push_back(p.get<std::string>());
  } else if (p.is_array()) {
    if (p.empty()) return bad_request("'prompt' must not be empty", "prompt");
    if (p[0].is_number_integer()) {
      r->token_prompts.emplace_back();
      if (auto e = read_token_ids(p, "prompt", &r->token_prompts.back())) return e;
    } else {
      for (const auto& x : p) {
        if (x.is_string()) {
          r->text_prompts.push_back(x.get<std::string>());
        } else if (x.is_array()) {
          if (x.empty()) return bad_request("a token-id prompt must not be empty", "prompt");
          r->token_prompts.emplace_back();
          if (auto e = read_token_ids(x, "prompt", &r->token_prompts.back())) return e;
        } else {
          return wrong_type("prompt", "a string, an array of strings or an array of token ids", x);
        }
      }
      if (!r->text_prompts.empty() && !r->token_prompts.empty())
        return bad_request("'prompt' must not mix strings and token ids", "prompt");
    }
  } else {
    return wrong_type("prompt", "a string, an array of strings or an array of token ids", p);
  }
  for (const auto& s : r->text_prompts)
    if (s.empty()) return bad_request("'prompt' must not be empty", "prompt");
  return std::nullopt;
}

// messages: [{role, content}] with content a string, null or text parts; normalized to strings.
std::optional<ApiError> parse_messages(const json& b, OpenAiRequest* r) {
  auto it = b.find("messages");
  if (it == b.end() || it->is_null()) return bad_request("'messages' is required", "messages");
  if (!it->is_array()) return wrong_type("messages", "an array", *it);
  if (it->empty()) return bad_request("'messages' must contain at least one message", "messages");
  r->messages = nlohmann::ordered_json::array();
  for (size_t i = 0; i < it->size(); ++i) {
    const json& m = (*it)[i];
    const std::string param = fmt::format("messages[{}]", i);
    if (!m.is_object()) return wrong_type(param, "an object", m);
    auto role = m.find("role");
    if (role == m.end() || !role->is_string())
      return bad_request(fmt::format("'{}.role' must be a string", param), param + ".role");
    const std::string rs = role->get<std::string>();
    if (rs != "system" && rs != "user" && rs != "assistant" && rs != "tool" && rs != "developer")
      return bad_request(
          fmt::format("'{}.role' must be system, user, assistant, tool or developer, got '{}'",
                      param, rs),
          param + ".role");
    std::string content;
    auto c = m.find("content");
    if (c != m.end() && !c->is_null()) {
      if (c->is_string()) {
        content = c->get<std::string>();
      } else if (c->is_array()) {
        for (const auto& part : *c) {
          if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
              !part["text"].is_string())
            return bad_request(
                fmt::format("'{}.content' parts must be {{\"type\": \"text\", \"text\": ...}}; "
                            "other content types are not supported",
                            param),
                param + ".content");
          content += part["text"].get<std::string>();
        }
      } else {
        return wrong_type(param + ".content", "a string or an array of text parts", *c);
      }
    } else if (rs != "assistant") {
      return bad_request(fmt::format("'{}.content' is required", param), param + ".content");
    }
    nlohmann::ordered_json msg = {{"role", rs}, {"content", content}};
    if (auto name = m.find("name"); name != m.end() && name->is_string()) msg["name"] = *name;
    if (auto calls = m.find("tool_calls"); calls != m.end() && !calls->is_null()) {
      if (rs != "assistant")
        return bad_request(fmt::format("'{}.tool_calls' belongs to assistant messages", param),
                           param + ".tool_calls");
      nlohmann::ordered_json parsed;
      if (auto e = parse_message_tool_calls(*calls, param + ".tool_calls", &parsed)) return e;
      r->history_tool_calls += int(parsed.size());
      msg["tool_calls"] = std::move(parsed);
    }
    if (auto id = m.find("tool_call_id"); id != m.end() && !id->is_null()) {
      if (!id->is_string()) return wrong_type(param + ".tool_call_id", "a string", *id);
      msg["tool_call_id"] = *id;
    }
    // A reasoning model's earlier thinking (SGLang, vLLM): passed to the chat template, which
    // shows it where the template has a place for it (Qwen3, DeepSeek-R1) and ignores it elsewhere.
    if (auto rc = m.find("reasoning_content"); rc != m.end() && !rc->is_null()) {
      if (!rc->is_string()) return wrong_type(param + ".reasoning_content", "a string", *rc);
      msg["reasoning_content"] = *rc;
    }
    r->messages.push_back(std::move(msg));
  }
  return std::nullopt;
}

// Parameters that would change the output and that this server does not implement: refused,
// never ignored.
std::optional<ApiError> reject_unsupported(const json& b) {
  auto unsupported = [](const char* key, std::string why = "") {
    return bad_request(fmt::format("'{}' is not supported{}", key, why), key,
                       "unsupported_parameter");
  };
  // SGLang's constrained decoding and custom processors.
  for (const char* key :
       {"regex", "ebnf", "json_schema", "structural_tag", "custom_logit_processor"}) {
    auto it = b.find(key);
    if (it != b.end() && !it->is_null()) return unsupported(key);
  }
  if (auto it = b.find("response_format");
      it != b.end() && it->is_object() && it->value("type", "text") != "text")
    return unsupported("response_format", " other than text");
  // SGLang's and vLLM's fields that change the prompt or the text, at their non-default values.
  for (const char* key : {"no_stop_trim", "return_hidden_states"})
    if (auto it = b.find(key); it != b.end() && it->is_boolean() && it->get<bool>())
      return unsupported(key);
  if (auto it = b.find("lora_path"); it != b.end() && !it->is_null())
    return unsupported("lora_path");
  if (auto it = b.find("suffix"); it != b.end() && !it->is_null()) return unsupported("suffix");
  if (auto it = b.find("best_of"); it != b.end() && it->is_number() && it->get<double>() > 1)
    return unsupported("best_of");
  return std::nullopt;
}

// stop (a string or up to kMaxStops strings) and SGLang's stop_token_ids.
std::optional<ApiError> parse_stop(const json& b, OpenAiRequest* r) {
  std::vector<std::string>& stops = r->sampling.stop_strings;
  if (auto it = b.find("stop"); it != b.end() && !it->is_null()) {
    if (it->is_string()) {
      stops.push_back(it->get<std::string>());
    } else if (it->is_array()) {
      for (const auto& s : *it) {
        if (!s.is_string()) return wrong_type("stop", "a string or an array of strings", s);
        stops.push_back(s.get<std::string>());
      }
    } else {
      return wrong_type("stop", "a string or an array of strings", *it);
    }
  }
  if (stops.size() > kMaxStops)
    return bad_request(fmt::format("'stop' allows at most {} strings", kMaxStops), "stop");
  for (const auto& s : stops)
    if (s.empty()) return bad_request("'stop' strings must not be empty", "stop");
  if (auto ids = b.find("stop_token_ids"); ids != b.end() && !ids->is_null()) {
    if (!ids->is_array()) return wrong_type("stop_token_ids", "an array of integers", *ids);
    if (auto e = read_token_ids(*ids, "stop_token_ids", &r->sampling.stop_token_ids)) return e;
  }
  return std::nullopt;
}

// logit_bias: {"token id": bias}, keys as strings (JSON has no other), sorted into the params.
std::optional<ApiError> parse_logit_bias(const json& b, SamplingParams* p) {
  auto it = b.find("logit_bias");
  if (it == b.end() || it->is_null()) return std::nullopt;
  if (!it->is_object()) return wrong_type("logit_bias", "an object of token ids to numbers", *it);
  for (const auto& [key, value] : it->items()) {
    size_t used = 0;
    long long id = -1;
    try {
      id = std::stoll(key, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != key.size() || id < 0 || id > INT32_MAX)
      return bad_request(fmt::format("'logit_bias' keys must be token ids, got '{}'",
                                     tok::to_valid_utf8(key.substr(0, 40))),
                         "logit_bias");
    if (!value.is_number())
      return wrong_type("logit_bias", "an object of token ids to numbers", value);
    p->logit_bias.emplace_back(int32_t(id), float(value.get<double>()));
  }
  std::sort(p->logit_bias.begin(), p->logit_bias.end());
  return std::nullopt;
}

// A number field into a float (its range is the request contract's, validate_sampling).
std::optional<ApiError> read_float(const json& b, const char* key, float* out) {
  double d = *out;
  if (auto e = read_number(b, key, -DBL_MAX, DBL_MAX, &d)) return e;
  *out = float(d);
  return std::nullopt;
}

// Completions' echo (chat refuses it: OpenAI's chat API has none).
std::optional<ApiError> parse_echo(const json& b, OpenAiRequest* r) {
  if (auto e = read_bool(b, "echo", &r->echo)) return e;
  if (r->echo && r->endpoint == Endpoint::kChat)
    return bad_request("'echo' is not supported by /v1/chat/completions (use /v1/completions)",
                       "echo", "unsupported_parameter");
  return std::nullopt;
}

// Chat's add_generation_prompt and vLLM's continue_final_message (completions: refused at their
// non-default values, which would change a chat prompt that completions do not build).
std::optional<ApiError> parse_generation_prompt(const json& b, OpenAiRequest* r) {
  if (auto e = read_bool(b, "add_generation_prompt", &r->add_generation_prompt)) return e;
  if (auto e = read_bool(b, "continue_final_message", &r->continue_final_message)) return e;
  if (r->endpoint != Endpoint::kChat) {
    if (!r->add_generation_prompt)
      return bad_request("'add_generation_prompt' applies to /v1/chat/completions only",
                         "add_generation_prompt");
    if (r->continue_final_message)
      return bad_request("'continue_final_message' applies to /v1/chat/completions only",
                         "continue_final_message");
  }
  if (r->continue_final_message && r->add_generation_prompt)
    return bad_request(
        "'continue_final_message' continues the final assistant message, so it needs "
        "'add_generation_prompt': false (both true contradict each other)",
        "continue_final_message");
  return std::nullopt;
}

std::optional<ApiError> parse_sampling(const json& b, OpenAiRequest* r) {
  SamplingParams& p = r->sampling;
  std::optional<int64_t> v;
  if (auto e = read_int(b, "n", 1, kMaxN, &v)) return e;
  if (v) r->n = int(*v);
  v.reset();
  if (auto e = read_int(b, "max_tokens", INT32_MIN, INT32_MAX, &v)) return e;
  if (v) r->max_tokens = int32_t(*v);
  v.reset();
  if (auto e = read_int(b, "max_completion_tokens", INT32_MIN, INT32_MAX, &v)) return e;
  if (v) r->max_tokens = int32_t(*v);
  // echo with max_tokens 0: the prompt (and its logprobs) alone, as lm-evaluation-harness's
  // loglikelihood requests ask. The engine samples one token, which the response leaves out.
  if (r->echo && r->max_tokens == 0) {
    r->prompt_only = true;
    r->max_tokens = 1;
  }
  for (auto [key, field] : {std::pair{"temperature", &p.temperature},
                            {"top_p", &p.top_p},
                            {"min_p", &p.min_p},
                            {"repetition_penalty", &p.repetition_penalty},
                            {"presence_penalty", &p.presence_penalty},
                            {"frequency_penalty", &p.frequency_penalty}})
    if (auto e = read_float(b, key, field)) return e;
  v.reset();
  if (auto e = read_int(b, "top_k", INT32_MIN, INT32_MAX, &v)) return e;
  if (v) p.top_k = int32_t(*v);
  v.reset();
  if (auto e = read_int(b, "seed", INT64_MIN, INT64_MAX, &v)) return e;
  if (v) p.seed = uint64_t(*v);
  if (auto e = read_bool(b, "ignore_eos", &p.ignore_eos)) return e;
  if (auto e = read_bool(b, "include_stop_str_in_output", &p.include_stop_str_in_output)) return e;
  // vLLM's min_tokens, SGLang's min_new_tokens (its /generate's name; both on either endpoint).
  for (const char* key : {"min_tokens", "min_new_tokens"}) {
    v.reset();
    if (auto e = read_int(b, key, INT32_MIN, INT32_MAX, &v)) return e;
    if (v) p.min_new_tokens = int32_t(*v);
  }
  if (auto e = parse_logit_bias(b, &p)) return e;
  if (auto e = parse_stop(b, r)) return e;
  // The values, checked by the contract the engine applies again (the max_tokens of a request
  // that gives none is the server's choice, always >= 1: min_tokens is checked against it then).
  if (r->max_tokens) p.max_new_tokens = *r->max_tokens;
  SamplingParams check = p;
  check.max_new_tokens = r->max_tokens ? *r->max_tokens : INT32_MAX;
  if (auto e = validate_sampling(check)) return api_error_from(*e);
  return std::nullopt;
}

std::optional<ApiError> parse_logprobs(const json& b, OpenAiRequest* r) {
  std::optional<int64_t> v;
  if (r->endpoint == Endpoint::kCompletions) {
    if (auto e = read_int(b, "logprobs", 0, kMaxTopLogprobs, &v)) return e;
    if (v) r->top_logprobs = int(*v);
    return std::nullopt;
  }
  bool want = false;
  if (auto e = read_bool(b, "logprobs", &want)) return e;
  if (auto e = read_int(b, "top_logprobs", 0, kMaxTopLogprobs, &v)) return e;
  if (v && !want)
    return bad_request("'top_logprobs' requires 'logprobs' to be true", "top_logprobs");
  if (want) r->top_logprobs = v ? int(*v) : 0;
  return std::nullopt;
}

// A token's text for logprobs: its bytes may be part of a UTF-8 sequence, so the string is made
// valid and the raw bytes are given separately (as OpenAI does).
struct TokenText {
  std::string text;
  json bytes;
};
TokenText token_text(const Tokenizer& tok, int32_t id) {
  const std::string raw = tok.decode(std::span<const int32_t>(&id, 1));
  json bytes = json::array();
  for (unsigned char c : raw) bytes.push_back(int(c));
  return {tok::to_valid_utf8(raw), std::move(bytes)};
}

json chat_logprobs(const std::vector<int32_t>& ids, const std::vector<TokenLogprobs>& lps,
                   const Tokenizer& tok) {
  json content = json::array();
  for (size_t i = 0; i < ids.size() && i < lps.size(); ++i) {
    TokenText t = token_text(tok, ids[i]);
    json top = json::array();
    for (const auto& [tid, lp] : lps[i].top) {
      TokenText tt = token_text(tok, tid);
      top.push_back({{"token", tt.text}, {"logprob", lp}, {"bytes", tt.bytes}});
    }
    content.push_back({{"token", t.text},
                       {"logprob", lps[i].logprob},
                       {"bytes", t.bytes},
                       {"top_logprobs", top}});
  }
  return {{"content", content}};
}

// The tokens' logprobs: lps[i] is token unscored + i's; the first `unscored` tokens (an echoed
// prompt's first token, which nothing precedes) have null logprobs, as OpenAI's echo gives.
json completion_logprobs(const std::vector<int32_t>& ids, const std::vector<TokenLogprobs>& lps,
                         const Tokenizer& tok, size_t text_offset, size_t unscored = 0) {
  json tokens = json::array(), token_lps = json::array(), tops = json::array(),
       offsets = json::array();
  for (size_t i = 0; i < ids.size() && (i < unscored || i - unscored < lps.size()); ++i) {
    TokenText t = token_text(tok, ids[i]);
    tokens.push_back(t.text);
    if (i < unscored) {
      token_lps.push_back(nullptr);
      tops.push_back(nullptr);
    } else {
      const TokenLogprobs& lp = lps[i - unscored];
      token_lps.push_back(lp.logprob);
      json top = json::object();
      for (const auto& [tid, v] : lp.top) top[token_text(tok, tid).text] = v;
      tops.push_back(top);
    }
    offsets.push_back(text_offset);
    text_offset += t.text.size();
  }
  return {{"tokens", tokens},
          {"token_logprobs", token_lps},
          {"top_logprobs", tops},
          {"text_offset", offsets}};
}

}  // namespace

json ApiError::to_json() const {
  return {{"error",
           {{"message", message},
            {"type", type},
            {"param", param.empty() ? json(nullptr) : json(param)},
            {"code", code.empty() ? json(nullptr) : json(code)}}}};
}

ApiError api_error(int status, std::string message, std::string type, std::string param,
                   std::string code) {
  ApiError e;
  e.status = status;
  e.message = std::move(message);
  e.type = std::move(type);
  e.param = std::move(param);
  e.code = std::move(code);
  return e;
}

ApiError bad_request(std::string message, std::string param, std::string code) {
  return api_error(400, std::move(message), "invalid_request_error", std::move(param),
                   std::move(code));
}

ApiError server_error(int status, std::string message, std::string code) {
  return api_error(status, std::move(message), "server_error", "", std::move(code));
}

ApiError api_error_from(const RequestError& e, const std::string& prompt_param) {
  const std::string param = e.param == "prompt" ? prompt_param : e.param;
  const std::string message = e.describe("'" + param + "'");
  switch (e.code) {
    case RequestErrorCode::kInvalidValue:
      return bad_request(message, param);
    case RequestErrorCode::kContextLengthExceeded:
      return bad_request(message, param, "context_length_exceeded");
    case RequestErrorCode::kUnsupported:
      return bad_request(message, param, "unsupported_parameter");
    case RequestErrorCode::kUnavailable:
      return server_error(503, message, "unavailable");
  }
  return server_error(500, message);
}

std::optional<ApiError> check_json_content_type(std::string_view content_type) {
  std::string type(content_type.substr(0, content_type.find(';')));
  while (!type.empty() && (type.back() == ' ' || type.back() == '\t')) type.pop_back();
  while (!type.empty() && (type.front() == ' ' || type.front() == '\t')) type.erase(0, 1);
  for (char& c : type) c = char(std::tolower(static_cast<unsigned char>(c)));
  const bool json_suffix = type.size() > 5 && type.compare(type.size() - 5, 5, "+json") == 0;
  if (type.empty() || type == "application/json" || json_suffix) return std::nullopt;
  return api_error(
      415,
      fmt::format("the request body must be JSON sent as Content-Type: application/json, "
                  "not '{}'",
                  tok::to_valid_utf8(std::string(content_type.substr(0, 200)))),
      "invalid_request_error", "", "unsupported_media_type");
}

std::optional<ApiError> read_bool(const json& b, const char* key, bool* out) {
  auto it = b.find(key);
  if (it == b.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean()) return wrong_type(key, "a boolean", *it);
  *out = it->get<bool>();
  return std::nullopt;
}

std::optional<ApiError> parse_json_body(std::string_view body, json* out) {
  if (!tok::is_valid_utf8(body))
    return bad_request("the request body is not valid UTF-8", "", "invalid_utf8");
  if (Status s = check_json_depth(body, "the request body"); !s.ok())
    return bad_request(s.message(), "", "invalid_json");
  try {
    *out = json::parse(body);
  } catch (const json::exception& e) {
    // parse_error, or out_of_range for a number beyond double (1e999). The parser's message
    // quotes the bytes it stopped at, possibly half a UTF-8 character.
    return bad_request(
        fmt::format("the request body is not valid JSON: {}", tok::to_valid_utf8(e.what())), "",
        "invalid_json");
  }
  if (!out->is_object()) return bad_request("the request body must be a JSON object");
  return std::nullopt;
}

std::optional<ApiError> parse_openai_request(std::string_view body, Endpoint endpoint,
                                             OpenAiRequest* r) {
  json b;
  if (auto e = parse_json_body(body, &b)) return e;
  r->endpoint = endpoint;
  if (auto e = read_string(b, "model", &r->model)) return e;
  if (auto e = reject_unsupported(b)) return e;
  if (auto e = endpoint == Endpoint::kChat ? parse_messages(b, r) : parse_prompt(b, r)) return e;
  // The tools keep their key order for the chat template (tojson prints them as sent): the body
  // is parsed once more, keeping it, when it has any.
  nlohmann::ordered_json ordered;
  if (auto t = b.find("tools"); t != b.end() && t->is_array() && !t->empty())
    ordered = nlohmann::ordered_json::parse(body);
  if (auto e = parse_tools(b, ordered, r)) return e;
  if (auto e = parse_echo(b, r)) return e;
  if (auto e = parse_sampling(b, r)) return e;
  if (auto e = parse_logprobs(b, r)) return e;
  if (r->echo && r->top_logprobs >= 0) r->prompt_logprobs_from = 0;
  if (auto k = b.find("chat_template_kwargs"); k != b.end() && !k->is_null()) {
    if (!k->is_object()) return wrong_type("chat_template_kwargs", "an object", *k);
    if (endpoint != Endpoint::kChat)
      return bad_request("'chat_template_kwargs' applies to /v1/chat/completions only",
                         "chat_template_kwargs");
    r->chat_template_kwargs = *k;
  }
  if (auto e = parse_generation_prompt(b, r)) return e;
  if (auto e = read_bool(b, "stream", &r->stream)) return e;
  if (auto e = read_bool(b, "separate_reasoning", &r->separate_reasoning)) return e;
  if (auto e = read_bool(b, "stream_reasoning", &r->stream_reasoning)) return e;
  if (auto e = read_bool(b, "skip_special_tokens", &r->skip_special_tokens)) return e;
  if (auto e = read_bool(b, "return_meta_info", &r->return_meta_info)) return e;
  if (auto so = b.find("stream_options"); so != b.end() && !so->is_null()) {
    if (!so->is_object()) return wrong_type("stream_options", "an object", *so);
    if (auto e = read_bool(*so, "include_usage", &r->include_usage)) return e;
  }
  if (int64_t(r->num_prompts()) * r->n > kMaxN)
    return bad_request(fmt::format("prompts x n must be at most {}", kMaxN), "n");
  return std::nullopt;
}

json Usage::to_json() const {
  json u = {{"prompt_tokens", prompt_tokens},
            {"completion_tokens", completion_tokens},
            {"total_tokens", prompt_tokens + completion_tokens}};
  u["prompt_tokens_details"] = {{"cached_tokens", cached_tokens}};
  if (include_spec) {
    u["spec_verify_ct"] = spec_verify_ct;
    u["spec_draft_token_num"] = spec_draft_token_num;
    u["spec_accept_token_num"] = spec_accept_token_num;
    // Tokens per verify (accepted drafts + the target's own); 1 without verifies.
    u["spec_accept_length"] =
        spec_verify_ct > 0 ? double(spec_accept_token_num + spec_verify_ct) / double(spec_verify_ct)
                           : 1.0;
  }
  return u;
}

size_t unscored_prompt_tokens(size_t prompt_len, size_t num_logprobs, int32_t from) {
  const size_t unscored = std::min(prompt_len, size_t(std::max(from, 0)));
  return num_logprobs == prompt_len - unscored ? unscored : prompt_len;
}

json finish_reason_json(FinishReason r) {
  if (r == FinishReason::kNone) return nullptr;
  // "abort" is no OpenAI value: a completion cut before it finished (the drain timeout at
  // shutdown) is "length", which clients know; usage says how many tokens it holds.
  if (r == FinishReason::kAbort) return "length";
  return finish_reason_name(r);
}

json build_response(const OpenAiRequest& req, const ResponseMeta& meta,
                    const std::vector<ChoiceResult>& choices, const Usage& usage,
                    const Tokenizer& tok) {
  const bool chat = req.endpoint == Endpoint::kChat;
  json out = {{"id", meta.id},
              {"object", chat ? "chat.completion" : "text_completion"},
              {"created", meta.created},
              {"model", meta.model}};
  json cs = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const ChoiceResult& c = choices[i];
    json choice = {{"index", i}, {"finish_reason", finish_reason_json(c.finish_reason)}};
    json lp = nullptr;
    if (req.top_logprobs >= 0 && req.echo) {
      // The prompt's tokens, then the completion's: one list (logprobs from the scored one on).
      std::vector<int32_t> ids = c.prompt_ids;
      ids.insert(ids.end(), c.token_ids.begin(), c.token_ids.end());
      const size_t unscored = unscored_prompt_tokens(c.prompt_ids.size(), c.prompt_logprobs.size(),
                                                     c.prompt_logprobs_from);
      std::vector<TokenLogprobs> lps;
      if (unscored < c.prompt_ids.size()) lps = c.prompt_logprobs;
      lps.insert(lps.end(), c.logprobs.begin(), c.logprobs.end());
      lp = completion_logprobs(ids, lps, tok, 0, unscored);
    } else if (req.top_logprobs >= 0) {
      lp = chat ? chat_logprobs(c.token_ids, c.logprobs, tok)
                : completion_logprobs(c.token_ids, c.logprobs, tok, 0);
    }
    if (chat) {
      // With tool calls, content is null unless the model wrote more than white space.
      const bool blank = c.text.find_first_not_of(" \n\t\r") == std::string::npos;
      choice["message"] = {
          {"role", "assistant"},
          {"content", !c.tool_calls.empty() && blank ? json(nullptr) : json(c.text)}};
      if (c.reasoning)
        choice["message"]["reasoning_content"] =
            c.reasoning->empty() ? json(nullptr) : json(*c.reasoning);
      if (!c.tool_calls.empty()) {
        choice["message"]["tool_calls"] = tool_calls_json(c.tool_calls);
        if (c.finish_reason == FinishReason::kStop) choice["finish_reason"] = "tool_calls";
      }
    } else {
      choice["text"] = c.echo_text + c.text;
    }
    choice["logprobs"] = lp;
    if (!c.error.empty()) choice["error"] = c.error;
    cs.push_back(std::move(choice));
  }
  out["choices"] = std::move(cs);
  out["usage"] = usage.to_json();
  return out;
}

json build_chunk(const OpenAiRequest& req, const ResponseMeta& meta, const ChunkPart& part,
                 const Tokenizer& tok) {
  const bool chat = req.endpoint == Endpoint::kChat;
  json choice = {{"index", part.choice}};
  json lp = nullptr;
  if (req.top_logprobs >= 0 && !part.token_ids.empty())
    lp = chat ? chat_logprobs(part.token_ids, part.logprobs, tok)
              : completion_logprobs(part.token_ids, part.logprobs, tok, part.text_offset,
                                    part.unscored);
  if (chat) {
    json delta = json::object();
    if (part.first) delta["role"] = "assistant";
    if (!part.reasoning.empty()) delta["reasoning_content"] = part.reasoning;
    if (part.first || !part.text.empty()) delta["content"] = part.text;
    if (!part.tool_calls.empty())
      delta["tool_calls"] = tool_call_deltas_json(part.tool_calls, part.tool_index);
    choice["delta"] = std::move(delta);
  } else {
    choice["text"] = part.text;
  }
  choice["logprobs"] = lp;
  choice["finish_reason"] = part.finish ? finish_reason_json(*part.finish) : json(nullptr);
  if (part.finish && part.called_tools && *part.finish == FinishReason::kStop)
    choice["finish_reason"] = "tool_calls";
  json out = {{"id", meta.id},
              {"object", chat ? "chat.completion.chunk" : "text_completion"},
              {"created", meta.created},
              {"model", meta.model},
              {"choices", json::array({std::move(choice)})}};
  if (req.include_usage) out["usage"] = nullptr;
  return out;
}

json build_usage_chunk(const OpenAiRequest& req, const ResponseMeta& meta, const Usage& usage) {
  const bool chat = req.endpoint == Endpoint::kChat;
  return {{"id", meta.id},
          {"object", chat ? "chat.completion.chunk" : "text_completion"},
          {"created", meta.created},
          {"model", meta.model},
          {"choices", json::array()},
          {"usage", usage.to_json()}};
}

}  // namespace strata
