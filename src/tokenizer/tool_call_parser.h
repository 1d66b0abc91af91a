// Tool-call parsers (SGLang's --tool-call-parser): a model given `tools` answers a call by writing
// it in its own markup (Kimi K2: `<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:0
// <|tool_call_argument_begin|>{...}<|tool_call_end|><|tool_calls_section_end|>`); the chat API
// returns each call as `tool_calls[i]` {id, type "function", function {name, arguments}} and the
// text around them as `content`, in whole responses and in streamed deltas.
//
// Nothing is lost: a call that does not parse (arguments that are not a JSON object, a name
// missing, the output cut before the call's end tag) stays in `content` as the model wrote it.
// Text after a section ends is content again. Tags that the tokenizer holds as special tokens
// must reach the text: tool_call_tag_token_ids lists them for the decoder (Kimi K2's are).
// Calls come out whole, once their end tag arrives (a streamed delta carries a call's name and
// all its arguments at once; OpenAI clients accumulate either way).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "tokenizer/tokenizer.h"

namespace strata {

// How a format writes one call between its tags.
enum class ToolCallBody {
  kKimiK2,       // functions.NAME:INDEX<|tool_call_argument_begin|>{arguments}
  kDeepSeekV3,   // function<｜tool▁sep｜>NAME\n```json\n{arguments}\n```
  kDeepSeekV31,  // NAME<｜tool▁sep｜>{arguments}
  kJsonObject,   // {"name": NAME, "arguments" (or "parameters"): {...}} (Qwen 2.5, Hermes)
  kLlama3,       // the whole output: {"name", "parameters"} objects separated by ';'
};

struct ToolCallFormat {
  std::string name;                        // as --tool-call-parser names it
  std::string section_begin, section_end;  // around the calls ("": none, calls stand alone)
  std::string call_begin, call_end;        // around each call (kLlama3: none)
  std::string separator;                   // inside a call, between its parts ("": none)
  ToolCallBody body = ToolCallBody::kJsonObject;
};

// The format --tool-call-parser `name` selects, or an error listing the known names.
StatusOr<ToolCallFormat> tool_call_format(std::string_view name);
std::vector<std::string> tool_call_format_names();

// The ids of the format's tags that are special tokens of `tok` (a decoder skipping special
// tokens keeps these).
std::vector<int32_t> tool_call_tag_token_ids(const ToolCallFormat& format, const Tokenizer& tok);

struct ToolCall {
  std::string name;
  std::string arguments;  // a JSON object's text
  // Kimi K2 writes an id of its own (functions.NAME:INDEX), which its chat template renders back
  // in the next turn; "" for the other formats (the server makes one).
  std::string model_id;
};

// Splits one choice's text (after any reasoning) as it arrives. Text that could still be the
// beginning of a tag is held back until the next push (or finish), and a call until its end tag.
class ToolCallSplitter {
 public:
  struct Parts {
    std::string content;
    std::vector<ToolCall> calls;
  };
  explicit ToolCallSplitter(ToolCallFormat format);
  Parts push(std::string_view text);
  // The end of the output: everything held back (an unfinished call as content).
  Parts finish();
  // push(text) then finish(), in one result (a whole response).
  Parts push_and_finish(std::string_view text);

 private:
  enum class Phase { kOpening, kContent, kSection, kWhole };
  void scan(Parts* out, bool final);
  // Inside a section (or at a stand-alone call): consumes what is complete. False: wait for more.
  bool step_section(Parts* out, bool final);
  // Text of the section that did not parse: content, preceded by the section's tag the first
  // time (so the content reads as the model wrote it).
  void fall_back(std::string_view raw, Parts* out);

  ToolCallFormat format_;
  Phase phase_;
  int section_calls_ = 0;  // calls of the current section that parsed
  bool tag_out_ = false;   // the current section's tag went to content (a call did not parse)
  std::string buffer_;
};

// Parses one call's text between call_begin and call_end (exposed for tests). False when it is
// not a well-formed call of the format.
bool parse_tool_call(const ToolCallFormat& format, std::string_view body, ToolCall* out);

// A parsed call as the chat API returns it (and strata generate records it).
struct ApiToolCall {
  std::string id;  // Kimi K2: functions.NAME:N (N counting the conversation's calls); call_<hex>
  std::string name;
  std::string arguments;
};

// Ids for one answer's calls: `first` is the number of calls the conversation made before (Kimi
// K2's ids count them); `parallel` false keeps only the answer's first call (`already` calls came
// out before).
std::vector<ApiToolCall> name_tool_calls(const ToolCallFormat& format, std::vector<ToolCall> calls,
                                         int first, int already, bool parallel);

// The calls as OpenAI's message.tool_calls ({id, type "function", function {name, arguments}}).
nlohmann::json tool_calls_json(const std::vector<ApiToolCall>& calls);

// An earlier call's arguments as chat templates read them: the JSON text parsed into an object
// (key order kept; templates print it with tojson), as vLLM and SGLang pass them; text that is no
// JSON stays a string.
nlohmann::ordered_json template_arguments(const std::string& arguments);

}  // namespace strata
