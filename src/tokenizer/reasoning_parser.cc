#include "tokenizer/reasoning_parser.h"

#include <algorithm>
#include <array>

namespace strata {

namespace {

// SGLang's parser names for the formats of the models strata serves (and their kin).
const std::array<ReasoningFormat, 7> kFormats = {{
    {"deepseek-r1", "<think>", "</think>", "", true},
    {"deepseek-v3", "<think>", "</think>", "", false},
    {"qwen3", "<think>", "</think>", "<tool_call>", false},
    {"qwen3-thinking", "<think>", "</think>", "<tool_call>", true},
    {"glm45", "<think>", "</think>", "<tool_call>", false},
    {"kimi", "\u25c1think\u25b7", "\u25c1/think\u25b7", "", false},
    {"kimi_k2", "<think>", "</think>", "<|tool_calls_section_begin|>", false},
}};

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

}  // namespace

StatusOr<ReasoningFormat> reasoning_format(std::string_view name) {
  std::string known;
  for (const ReasoningFormat& f : kFormats) {
    if (f.name == name) return f;
    known += (known.empty() ? "" : ", ") + f.name;
  }
  return invalid_argument("--reasoning-parser: unknown parser '{}' (known: {})", name, known);
}

std::vector<int32_t> reasoning_tag_token_ids(const ReasoningFormat& format, const Tokenizer& tok) {
  std::vector<int32_t> ids;
  for (const std::string* tag : {&format.start, &format.end, &format.tool_start}) {
    if (tag->empty()) continue;
    if (auto id = tok.token_to_id(*tag); id && tok.is_special(*id)) ids.push_back(*id);
  }
  return ids;
}

bool starts_inside_reasoning(const ReasoningFormat& format, const Tokenizer& tok,
                             const std::vector<int32_t>& prompt_ids) {
  if (format.always_thinking) return true;
  // The last few tokens hold the tag and the white space after it.
  const size_t n = std::min<size_t>(prompt_ids.size(), 8);
  std::string tail = tok.decode(std::span<const int32_t>(prompt_ids).last(n), false);
  while (!tail.empty() && is_space(tail.back())) tail.pop_back();
  return tail.ends_with(format.start);
}

ReasoningSplitter::ReasoningSplitter(const ReasoningFormat& format, bool starts_inside,
                                     bool stream_reasoning)
    : format_(format),
      phase_(starts_inside ? Phase::kReasoning : Phase::kOpening),
      stream_reasoning_(stream_reasoning),
      at_reasoning_start_(starts_inside),
      saw_reasoning_(starts_inside) {}

size_t ReasoningSplitter::partial_tag_suffix(std::initializer_list<const std::string*> tags) const {
  size_t longest = 0;
  for (const std::string* tag : tags) {
    if (tag->empty()) continue;
    for (size_t k = std::min(tag->size() - 1, buffer_.size()); k > longest; --k)
      if (buffer_.ends_with(std::string_view(*tag).substr(0, k))) {
        longest = k;
        break;
      }
  }
  return longest;
}

void ReasoningSplitter::take_reasoning(size_t n, Parts* out) {
  out->reasoning.append(buffer_, 0, n);
  buffer_.erase(0, n);
}

ReasoningSplitter::Parts ReasoningSplitter::push(std::string_view text) {
  buffer_ += text;
  Parts out;
  for (;;) {
    switch (phase_) {
      case Phase::kOpening: {  // before the first text: does the output open the reasoning?
        const size_t first = buffer_.find_first_not_of(" \n\t\r");
        if (first == std::string::npos) return out;  // white space only so far
        const std::string_view rest = std::string_view(buffer_).substr(first);
        if (rest.starts_with(format_.start)) {
          buffer_.erase(0, first + format_.start.size());
          phase_ = Phase::kReasoning;
          at_reasoning_start_ = saw_reasoning_ = true;
          continue;
        }
        if (std::string_view(format_.start).starts_with(rest)) return out;  // the tag, partly
        phase_ = Phase::kContent;
        continue;
      }
      case Phase::kReasoning: {
        if (at_reasoning_start_) {  // a start tag repeated where the prompt opened one
          if (buffer_.starts_with(format_.start)) {
            buffer_.erase(0, format_.start.size());
            continue;
          }
          if (buffer_.empty() || std::string_view(format_.start).starts_with(buffer_)) return out;
          at_reasoning_start_ = false;
        }
        const size_t end = buffer_.find(format_.end);
        const size_t tool =
            format_.tool_start.empty() ? std::string::npos : buffer_.find(format_.tool_start);
        if (end != std::string::npos || tool != std::string::npos) {
          const bool by_end = end <= tool;  // npos is the largest size_t
          take_reasoning(by_end ? end : tool, &out);
          if (by_end) buffer_.erase(0, format_.end.size());  // a tool section stays, in content
          phase_ = Phase::kContent;
          continue;
        }
        if (stream_reasoning_)
          take_reasoning(buffer_.size() - partial_tag_suffix({&format_.end, &format_.tool_start}),
                         &out);
        return out;
      }
      case Phase::kContent:
        out.content += buffer_;
        buffer_.clear();
        return out;
    }
  }
}

ReasoningSplitter::Parts ReasoningSplitter::finish() {
  Parts out;
  (phase_ == Phase::kReasoning ? out.reasoning : out.content) = std::move(buffer_);
  buffer_.clear();
  return out;
}

ReasoningSplitter::Parts ReasoningSplitter::push_and_finish(std::string_view text) {
  Parts out = push(text), tail = finish();
  out.reasoning += tail.reasoning;
  out.content += tail.content;
  return out;
}

}  // namespace strata
