// Fuzzes the tool-call parser's splitter (tokenizer/tool_call_parser.h): any text, pushed whole
// and in pieces of varying sizes, must split the same way both times (no tag lost or leaked at a
// piece boundary, no call parsed differently), never yield more content than the text holds, and
// lose nothing: when no call parsed, the content is the text itself.
// Input: byte 0 picks the format, byte 1 the piece sizes; the rest is the text.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "tokenizer/tool_call_parser.h"

namespace {

struct Split {
  std::string content;
  std::string calls;  // every call's parts, NUL-separated
};

void add(Split& s, const strata::ToolCallSplitter::Parts& p) {
  s.content += p.content;
  for (const strata::ToolCall& c : p.calls) {
    s.calls += c.name + '\0' + c.arguments + '\0' + c.model_id + '\0';
    if (c.name.empty()) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  static const std::vector<std::string> names = strata::tool_call_format_names();
  auto format = strata::tool_call_format(names[data[0] % names.size()]);
  if (!format.ok()) std::abort();
  const size_t step = size_t(data[1] % 7) + 1;
  const std::string_view text(reinterpret_cast<const char*>(data + 2), size - 2);

  Split whole, pieces;
  strata::ToolCallSplitter a(*format);
  add(whole, a.push(text));
  add(whole, a.finish());
  strata::ToolCallSplitter b(*format);
  for (size_t i = 0, n = step; i < text.size(); i += n, n = n % 7 + 1)
    add(pieces, b.push(text.substr(i, n)));
  add(pieces, b.finish());

  if (whole.content != pieces.content || whole.calls != pieces.calls) std::abort();
  if (whole.content.size() > text.size()) std::abort();
  if (whole.calls.empty() && whole.content != text) std::abort();
  return 0;
}
