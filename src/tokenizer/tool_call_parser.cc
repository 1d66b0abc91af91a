#include "tokenizer/tool_call_parser.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>

namespace strata {

namespace {

using ojson = nlohmann::ordered_json;

// SGLang's parser names for the formats of the models strata serves (and their kin). DeepSeek's
// tags are written with fullwidth bars (U+FF5C) and lower one-eighth blocks (U+2581), as its
// tokenizer holds them.
const std::array<ToolCallFormat, 7> kFormats = {{
    {"kimi_k2", "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
     "<|tool_call_end|>", "<|tool_call_argument_begin|>", ToolCallBody::kKimiK2},
    {"deepseekv3", "<\uff5ctool\u2581calls\u2581begin\uff5c>",
     "<\uff5ctool\u2581calls\u2581end\uff5c>", "<\uff5ctool\u2581call\u2581begin\uff5c>",
     "<\uff5ctool\u2581call\u2581end\uff5c>", "<\uff5ctool\u2581sep\uff5c>",
     ToolCallBody::kDeepSeekV3},
    {"deepseekv31", "<\uff5ctool\u2581calls\u2581begin\uff5c>",
     "<\uff5ctool\u2581calls\u2581end\uff5c>", "<\uff5ctool\u2581call\u2581begin\uff5c>",
     "<\uff5ctool\u2581call\u2581end\uff5c>", "<\uff5ctool\u2581sep\uff5c>",
     ToolCallBody::kDeepSeekV31},
    {"qwen25", "", "", "<tool_call>", "</tool_call>", "", ToolCallBody::kJsonObject},
    {"qwen", "", "", "<tool_call>", "</tool_call>", "", ToolCallBody::kJsonObject},
    {"hermes", "", "", "<tool_call>", "</tool_call>", "", ToolCallBody::kJsonObject},
    {"llama3", "", "", "", "", "", ToolCallBody::kLlama3},
}};

// Llama 3.1's marker before a call (its chat template's python tag); optional in the output.
constexpr std::string_view kPythonTag = "<|python_tag|>";

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

// Whether `s` is a proper beginning of `tag` (more text could complete it).
bool proper_prefix_of(std::string_view s, std::string_view tag) {
  return s.size() < tag.size() && tag.starts_with(s);
}

// Length of the longest end of `s` that is a proper beginning of `tag`.
size_t partial_suffix(std::string_view s, std::string_view tag) {
  for (size_t n = std::min(s.size(), tag.empty() ? 0 : tag.size() - 1); n > 0; --n)
    if (tag.starts_with(s.substr(s.size() - n))) return n;
  return 0;
}

// A JSON object's text, or nullopt.
std::optional<ojson> parse_object(std::string_view text) {
  try {
    ojson v = ojson::parse(text);
    if (v.is_object()) return v;
  } catch (const ojson::exception&) {
  }
  return std::nullopt;
}

// {"name": ..., "arguments" | "parameters": {...}} (arguments given as a string holding an object
// are taken too: some models encode them twice).
bool parse_json_call(std::string_view text, ToolCall* out) {
  std::optional<ojson> call = parse_object(trim(text));
  if (!call) return false;
  auto name = call->find("name");
  if (name == call->end() || !name->is_string() || name->get<std::string>().empty()) return false;
  ojson args = ojson::object();
  for (const char* key : {"arguments", "parameters"}) {
    auto it = call->find(key);
    if (it == call->end() || it->is_null()) continue;
    if (it->is_string()) {
      std::optional<ojson> inner = parse_object(it->get<std::string>());
      if (!inner) return false;
      args = std::move(*inner);
    } else if (it->is_object()) {
      args = *it;
    } else {
      return false;
    }
    break;
  }
  out->name = name->get<std::string>();
  try {
    out->arguments = args.dump();
  } catch (const ojson::exception&) {
    return false;  // a string that is not UTF-8
  }
  return true;
}

// Arguments written as JSON text: kept as written (trimmed), once they prove to be an object.
bool take_arguments(std::string_view text, ToolCall* out) {
  text = trim(text);
  if (!parse_object(text)) return false;
  out->arguments = std::string(text);
  return true;
}

bool valid_name(std::string_view name) {
  return !name.empty() && std::none_of(name.begin(), name.end(), is_space);
}

// The ends of the JSON objects of Llama 3's output, separated by ';' and white space; nullopt when
// the text is anything else. Strings and escapes are followed, so braces inside them do not count.
std::optional<std::vector<std::string_view>> split_objects(std::string_view text) {
  std::vector<std::string_view> objects;
  size_t i = 0;
  while (true) {
    while (i < text.size() && (is_space(text[i]) || (text[i] == ';' && !objects.empty()))) ++i;
    if (i == text.size()) break;
    if (text[i] != '{') return std::nullopt;
    const size_t start = i;
    int depth = 0;
    bool in_string = false, escaped = false;
    for (; i < text.size(); ++i) {
      const char c = text[i];
      if (in_string) {
        if (escaped) {
          escaped = false;
        } else if (c == '\\') {
          escaped = true;
        } else if (c == '"') {
          in_string = false;
        }
      } else if (c == '"') {
        in_string = true;
      } else if (c == '{' || c == '[') {
        ++depth;
      } else if ((c == '}' || c == ']') && --depth == 0) {
        break;
      }
    }
    if (i == text.size()) return std::nullopt;  // unbalanced
    objects.push_back(text.substr(start, ++i - start));
  }
  if (objects.empty()) return std::nullopt;
  return objects;
}

}  // namespace

StatusOr<ToolCallFormat> tool_call_format(std::string_view name) {
  for (const ToolCallFormat& f : kFormats)
    if (f.name == name) return f;
  std::string known;
  for (const std::string& n : tool_call_format_names()) known += (known.empty() ? "" : ", ") + n;
  return invalid_argument("--tool-call-parser: unknown parser '{}' (known: {})", name, known);
}

std::vector<std::string> tool_call_format_names() {
  std::vector<std::string> names;
  for (const ToolCallFormat& f : kFormats) names.push_back(f.name);
  return names;
}

std::vector<int32_t> tool_call_tag_token_ids(const ToolCallFormat& format, const Tokenizer& tok) {
  std::vector<int32_t> ids;
  const std::string python_tag(kPythonTag);
  for (const std::string* tag : {&format.section_begin, &format.section_end, &format.call_begin,
                                 &format.call_end, &format.separator}) {
    if (tag->empty()) continue;
    if (auto id = tok.token_to_id(*tag); id && tok.is_special(*id)) ids.push_back(*id);
  }
  if (format.body == ToolCallBody::kLlama3)
    if (auto id = tok.token_to_id(python_tag); id && tok.is_special(*id)) ids.push_back(*id);
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

bool parse_tool_call(const ToolCallFormat& format, std::string_view body, ToolCall* out) {
  *out = ToolCall{};
  switch (format.body) {
    case ToolCallBody::kJsonObject:
    case ToolCallBody::kLlama3:
      return parse_json_call(body, out);
    case ToolCallBody::kKimiK2: {
      const size_t sep = body.find(format.separator);
      if (sep == std::string_view::npos) return false;
      // functions.NAME:INDEX (SGLang also takes NAME:INDEX); NAME may hold dots.
      const std::string_view id = trim(body.substr(0, sep));
      const size_t colon = id.rfind(':');
      if (colon == std::string_view::npos || colon + 1 == id.size() ||
          !std::all_of(id.begin() + long(colon) + 1, id.end(),
                       [](char c) { return c >= '0' && c <= '9'; }))
        return false;
      std::string_view name = id.substr(0, colon);
      if (name.starts_with("functions.")) name.remove_prefix(10);
      if (!valid_name(name)) return false;
      out->name = std::string(name);
      out->model_id = std::string(id);
      return take_arguments(body.substr(sep + format.separator.size()), out);
    }
    case ToolCallBody::kDeepSeekV31: {
      const size_t sep = body.find(format.separator);
      if (sep == std::string_view::npos) return false;
      const std::string_view name = trim(body.substr(0, sep));
      if (!valid_name(name)) return false;
      out->name = std::string(name);
      return take_arguments(body.substr(sep + format.separator.size()), out);
    }
    case ToolCallBody::kDeepSeekV3: {
      // TYPE<｜tool▁sep｜>NAME\n```json\n{...}\n``` (TYPE is "function").
      const size_t sep = body.find(format.separator);
      if (sep == std::string_view::npos) return false;
      std::string_view rest = body.substr(sep + format.separator.size());
      const size_t nl = rest.find('\n');
      if (nl == std::string_view::npos) return false;
      const std::string_view name = trim(rest.substr(0, nl));
      if (!valid_name(name)) return false;
      std::string_view args = trim(rest.substr(nl + 1));
      if (!args.starts_with("```json") || !args.ends_with("```") || args.size() < 10) return false;
      args = args.substr(7, args.size() - 10);
      out->name = std::string(name);
      return take_arguments(args, out);
    }
  }
  return false;
}

std::vector<ApiToolCall> name_tool_calls(const ToolCallFormat& format, std::vector<ToolCall> calls,
                                         int first, int already, bool parallel) {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  std::vector<ApiToolCall> out;
  for (size_t i = 0; i < calls.size(); ++i) {
    if (!parallel && already + int(i) >= 1) break;
    ToolCall& c = calls[i];
    ApiToolCall o;
    // Kimi K2's template renders the id back in the next turn, and the model was trained on ids
    // that count the conversation's calls (SGLang renumbers the same way).
    o.id = format.body == ToolCallBody::kKimiK2
               ? fmt::format("functions.{}:{}", c.name, first + already + int(i))
               : fmt::format("call_{:016x}{:08x}", rng(), uint32_t(rng()));
    o.name = std::move(c.name);
    o.arguments = std::move(c.arguments);
    out.push_back(std::move(o));
  }
  return out;
}

nlohmann::json tool_calls_json(const std::vector<ApiToolCall>& calls) {
  nlohmann::json out = nlohmann::json::array();
  for (const ApiToolCall& c : calls)
    out.push_back({{"id", c.id},
                   {"type", "function"},
                   {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
  return out;
}

ojson template_arguments(const std::string& arguments) {
  try {
    return ojson::parse(arguments);
  } catch (const ojson::exception&) {
    return arguments;
  }
}

ToolCallSplitter::ToolCallSplitter(ToolCallFormat format)
    : format_(std::move(format)),
      phase_(format_.body == ToolCallBody::kLlama3 ? Phase::kOpening : Phase::kContent) {}

ToolCallSplitter::Parts ToolCallSplitter::push(std::string_view text) {
  buffer_ += text;
  Parts out;
  scan(&out, /*final=*/false);
  return out;
}

ToolCallSplitter::Parts ToolCallSplitter::finish() {
  Parts out;
  scan(&out, /*final=*/true);
  return out;
}

ToolCallSplitter::Parts ToolCallSplitter::push_and_finish(std::string_view text) {
  Parts out = push(text);
  Parts tail = finish();
  out.content += tail.content;
  for (ToolCall& c : tail.calls) out.calls.push_back(std::move(c));
  return out;
}

void ToolCallSplitter::fall_back(std::string_view raw, Parts* out) {
  if (!tag_out_ && !format_.section_begin.empty()) {
    out->content += format_.section_begin;
    tag_out_ = true;
  }
  out->content += raw;
}

void ToolCallSplitter::scan(Parts* out, bool final) {
  while (true) {
    switch (phase_) {
      case Phase::kOpening: {  // Llama 3: a call is the whole output, opened by '{' or the tag
        const std::string_view t = trim(buffer_);
        if (t.empty() && !final) return;
        if (t.starts_with('{') || t.starts_with(kPythonTag)) {
          phase_ = Phase::kWhole;
        } else if (!final && proper_prefix_of(t, kPythonTag)) {
          return;
        } else {
          phase_ = Phase::kContent;
        }
        break;
      }
      case Phase::kWhole: {
        if (!final) return;
        std::string_view t = trim(buffer_);
        if (t.starts_with(kPythonTag)) t.remove_prefix(kPythonTag.size());
        std::vector<ToolCall> calls;
        if (auto objects = split_objects(t)) {
          for (std::string_view o : *objects) {
            ToolCall c;
            if (!parse_tool_call(format_, o, &c)) break;
            calls.push_back(std::move(c));
          }
          if (calls.size() != objects->size()) calls.clear();
        }
        if (calls.empty()) out->content += buffer_;
        for (ToolCall& c : calls) out->calls.push_back(std::move(c));
        buffer_.clear();
        return;
      }
      case Phase::kContent: {
        if (format_.body == ToolCallBody::kLlama3) {
          out->content += buffer_;
          buffer_.clear();
          return;
        }
        const std::string& trigger =
            format_.section_begin.empty() ? format_.call_begin : format_.section_begin;
        const size_t at = buffer_.find(trigger);
        if (at == std::string::npos) {
          const size_t keep = final ? 0 : partial_suffix(buffer_, trigger);
          out->content.append(buffer_, 0, buffer_.size() - keep);
          buffer_.erase(0, buffer_.size() - keep);
          return;
        }
        out->content.append(buffer_, 0, at);
        // A section's tag is consumed here; a stand-alone call keeps its tag for step_section.
        buffer_.erase(0, format_.section_begin.empty() ? at : at + trigger.size());
        phase_ = Phase::kSection;
        section_calls_ = 0;
        tag_out_ = false;
        break;
      }
      case Phase::kSection:
        if (!step_section(out, final)) return;
        break;
    }
  }
}

bool ToolCallSplitter::step_section(Parts* out, bool final) {
  const bool sections = !format_.section_begin.empty();
  size_t lead = 0;
  while (lead < buffer_.size() && is_space(buffer_[lead])) ++lead;
  const std::string_view rest = std::string_view(buffer_).substr(lead);
  if (sections && rest.starts_with(format_.section_end)) {
    // Tags come out only around a section that kept text as written (an empty one included).
    if (section_calls_ == 0) fall_back(rest.substr(0, 0), out);
    if (tag_out_) out->content.append(buffer_, 0, lead + format_.section_end.size());
    buffer_.erase(0, lead + format_.section_end.size());
    phase_ = Phase::kContent;
    return true;
  }
  if (rest.starts_with(format_.call_begin)) {
    const size_t body = lead + format_.call_begin.size();
    const size_t end = buffer_.find(format_.call_end, body);
    if (end == std::string::npos) {
      if (!final) return false;  // the call is still coming
      fall_back(buffer_, out);   // cut before its end: as written
      buffer_.clear();
      phase_ = Phase::kContent;
      return true;
    }
    ToolCall call;
    if (parse_tool_call(format_, std::string_view(buffer_).substr(body, end - body), &call)) {
      out->calls.push_back(std::move(call));
      ++section_calls_;  // the white space before it is dropped
    } else {
      fall_back(std::string_view(buffer_).substr(0, end + format_.call_end.size()), out);
    }
    buffer_.erase(0, end + format_.call_end.size());
    return true;
  }
  if (!final && (proper_prefix_of(rest, format_.call_begin) ||
                 (sections && proper_prefix_of(rest, format_.section_end))))
    return false;
  // Anything else ends the calls: a section that never closed (its tag is content unless a call
  // of it parsed), or the text after stand-alone calls. The rest, white space included, is
  // content.
  if (section_calls_ == 0) fall_back(rest.substr(0, 0), out);
  phase_ = Phase::kContent;
  return true;
}

}  // namespace strata
