// Reasoning parsers (SGLang's --reasoning-parser): a thinking model writes its chain of thought
// between a start and an end tag (`<think>` … `</think>`); the chat API returns it as
// `reasoning_content` and the rest as `content`, in whole responses and in streamed deltas.
//
// Where the reasoning starts: the output opens with the start tag, or the prompt already did (a
// chat template that ends the generation prompt with `<think>`, as DeepSeek-V3.1's with
// thinking on), or the format always thinks (DeepSeek-R1, whose output often lacks the tag).
// It ends at the end tag, or at the format's tool-call section (Kimi K2 and Qwen3 may open one
// without closing the reasoning; the section stays in `content`). Output cut short inside the
// reasoning is all reasoning. Tags that the tokenizer holds as special tokens must reach the text:
// reasoning_tag_token_ids lists them for the decoder (Kimi K2.5's `</think>` is one).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "tokenizer/tokenizer.h"

namespace strata {

struct ReasoningFormat {
  std::string name;        // as --reasoning-parser names it
  std::string start, end;  // the tags
  std::string tool_start;  // a tool-call section's first tag ("": none)
  bool always_thinking = false;
};

// The format --reasoning-parser `name` selects, or an error listing the known names.
StatusOr<ReasoningFormat> reasoning_format(std::string_view name);

// The ids of the format's tags that are special tokens of `tok` (a decoder skipping special
// tokens keeps these).
std::vector<int32_t> reasoning_tag_token_ids(const ReasoningFormat& format, const Tokenizer& tok);

// Whether the output of `prompt_ids` starts inside the reasoning: the format always thinks, or
// the prompt's text ends with the start tag (white space after it aside).
bool starts_inside_reasoning(const ReasoningFormat& format, const Tokenizer& tok,
                             const std::vector<int32_t>& prompt_ids);

// Splits one choice's text as it arrives. Text that could still be the beginning of a tag is held
// back until the next push (or finish), so no tag is ever split between the two fields.
class ReasoningSplitter {
 public:
  struct Parts {
    std::string reasoning, content;
  };
  // `stream_reasoning` false: the reasoning comes out whole, when it ends (SGLang's field).
  ReasoningSplitter(const ReasoningFormat& format, bool starts_inside,
                    bool stream_reasoning = true);
  Parts push(std::string_view text);
  // The end of the output: everything held back.
  Parts finish();
  // push(text) then finish(), in one result (a whole response).
  Parts push_and_finish(std::string_view text);
  bool saw_reasoning() const { return saw_reasoning_; }

 private:
  enum class Phase { kOpening, kReasoning, kContent };
  // Length of the longest end of buffer_ that is a proper beginning of one of `tags`.
  size_t partial_tag_suffix(std::initializer_list<const std::string*> tags) const;
  void take_reasoning(size_t n, Parts* out);

  ReasoningFormat format_;
  Phase phase_;
  bool stream_reasoning_;
  bool at_reasoning_start_;  // no reasoning text yet: a (repeated) start tag there is dropped
  bool saw_reasoning_ = false;
  std::string buffer_;  // held back: a possible tag's beginning, or unstreamed reasoning
};

}  // namespace strata
