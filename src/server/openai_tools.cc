#include "server/openai_tools.h"

#include <fmt/format.h>

#include "server/openai_schema.h"

namespace strata {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

constexpr size_t kMaxTools = 128;  // OpenAI's limit

ApiError must_be(const std::string& param, const char* want) {
  return bad_request(fmt::format("'{}' must be {}", param, want), param);
}

std::optional<ApiError> check_tool(const json& t, const std::string& param) {
  if (!t.is_object())
    return must_be(param, "an object {\"type\": \"function\", \"function\": ...}");
  auto type = t.find("type");
  if (type == t.end() || *type != "function")
    return bad_request(fmt::format("'{}.type' must be \"function\"", param), param + ".type");
  auto fn = t.find("function");
  if (fn == t.end() || !fn->is_object()) return must_be(param + ".function", "an object");
  auto name = fn->find("name");
  if (name == fn->end() || !name->is_string() || name->get<std::string>().empty())
    return must_be(param + ".function.name", "a non-empty string");
  if (auto d = fn->find("description"); d != fn->end() && !d->is_null() && !d->is_string())
    return must_be(param + ".function.description", "a string");
  if (auto p = fn->find("parameters"); p != fn->end() && !p->is_null() && !p->is_object())
    return must_be(param + ".function.parameters", "a JSON Schema object");
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> parse_tools(const json& b, const ordered_json& ordered_body,
                                    OpenAiRequest* r) {
  const bool chat = r->endpoint == Endpoint::kChat;
  for (const char* key : {"tools", "tool_choice", "parallel_tool_calls"})
    if (auto it = b.find(key); !chat && it != b.end() && !it->is_null())
      return bad_request(fmt::format("'{}' applies to /v1/chat/completions only", key), key);
  if (auto it = b.find("functions"); it != b.end() && !it->is_null())
    return bad_request("'functions' (OpenAI's deprecated form) is not supported; send 'tools'",
                       "functions", "unsupported_parameter");
  if (!chat) return std::nullopt;
  if (auto it = b.find("tools"); it != b.end() && !it->is_null()) {
    if (!it->is_array()) return must_be("tools", "an array of tools");
    if (it->size() > kMaxTools)
      return bad_request(fmt::format("'tools' allows at most {} tools", kMaxTools), "tools");
    for (size_t i = 0; i < it->size(); ++i)
      if (auto e = check_tool((*it)[i], fmt::format("tools[{}]", i))) return e;
    if (!it->empty()) r->tools = ordered_body.at("tools");
  }
  if (auto it = b.find("tool_choice"); it != b.end() && !it->is_null()) {
    const bool named = it->is_object();
    if (!named && (!it->is_string() || (*it != "none" && *it != "auto" && *it != "required")))
      return must_be("tool_choice", "\"none\", \"auto\", \"required\" or a named function");
    if (named || *it == "required")
      return bad_request(
          "'tool_choice' \"required\" or a named function needs constrained decoding, which "
          "this server does not have; send \"auto\" (the model decides) or \"none\"",
          "tool_choice", "unsupported_parameter");
    r->tool_choice_none = *it == "none";
  }
  if (auto it = b.find("parallel_tool_calls"); it != b.end() && !it->is_null()) {
    if (!it->is_boolean()) return must_be("parallel_tool_calls", "a boolean");
    r->parallel_tool_calls = it->get<bool>();
  }
  return std::nullopt;
}

std::optional<ApiError> parse_message_tool_calls(const json& calls, const std::string& param,
                                                 ordered_json* out) {
  if (!calls.is_array()) return must_be(param, "an array");
  *out = ordered_json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    const json& c = calls[i];
    const std::string p = fmt::format("{}[{}]", param, i);
    if (!c.is_object()) return must_be(p, "an object");
    auto fn = c.find("function");
    if (fn == c.end() || !fn->is_object()) return must_be(p + ".function", "an object");
    auto name = fn->find("name");
    if (name == fn->end() || !name->is_string()) return must_be(p + ".function.name", "a string");
    auto id = c.find("id");
    if (id != c.end() && !id->is_string() && !id->is_null()) return must_be(p + ".id", "a string");
    ordered_json call = {{"id", id != c.end() && id->is_string() ? id->get<std::string>() : ""},
                         {"type", "function"}};
    ordered_json args = ordered_json::object();
    if (auto a = fn->find("arguments"); a != fn->end() && !a->is_null()) {
      if (a->is_string()) {
        args = template_arguments(a->get<std::string>());
      } else if (a->is_object()) {
        args = *a;
      } else {
        return must_be(p + ".function.arguments", "a JSON string");
      }
    }
    call["function"] = {{"name", *name}, {"arguments", std::move(args)}};
    out->push_back(std::move(call));
  }
  return std::nullopt;
}

ordered_json chat_template_context(const OpenAiRequest& r) {
  ordered_json ctx = r.chat_template_kwargs.is_object() ? ordered_json(r.chat_template_kwargs)
                                                        : ordered_json::object();
  if (wants_tool_calls(r)) ctx["tools"] = r.tools;
  return ctx;
}

bool wants_tool_calls(const OpenAiRequest& r) {
  return r.endpoint == Endpoint::kChat && !r.tools.is_null() && !r.tool_choice_none;
}

json tool_call_deltas_json(const std::vector<ApiToolCall>& calls, int first_index) {
  json out = tool_calls_json(calls);
  for (size_t i = 0; i < out.size(); ++i) out[i]["index"] = first_index + int(i);
  return out;
}

}  // namespace strata
