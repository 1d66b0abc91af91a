// Fuzzes the reasoning parser's splitter (tokenizer/reasoning_parser.h): any text, pushed whole
// and in pieces of varying sizes, must split the same way both times (no tag lost or leaked at a
// piece boundary), and the two fields must be made of the text's own bytes (the content a suffix
// of it, the reasoning a substring), never more of them than it holds.
// Input: byte 0 picks the format, byte 1 its mode (bit 0: the prompt opened the reasoning, bit 1:
// reasoning streamed), byte 2 the piece sizes; the rest is the text.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "tokenizer/reasoning_parser.h"

namespace {

const char* const kNames[] = {"deepseek-r1", "deepseek-v3", "qwen3",  "qwen3-thinking",
                              "glm45",       "kimi",        "kimi_k2"};

struct Split {
  std::string reasoning, content;
};

void add(Split& s, const strata::ReasoningSplitter::Parts& p) {
  s.reasoning += p.reasoning;
  s.content += p.content;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  auto format = strata::reasoning_format(kNames[data[0] % std::size(kNames)]);
  if (!format.ok()) std::abort();
  const bool inside = data[1] & 1, stream = data[1] & 2;
  const size_t step = size_t(data[2] % 7) + 1;
  const std::string_view text(reinterpret_cast<const char*>(data + 3), size - 3);

  Split whole, pieces;
  strata::ReasoningSplitter a(*format, inside, stream);
  add(whole, a.push(text));
  add(whole, a.finish());
  strata::ReasoningSplitter b(*format, inside, stream);
  for (size_t i = 0, n = step; i < text.size(); i += n, n = n % 7 + 1)
    add(pieces, b.push(text.substr(i, n)));
  add(pieces, b.finish());

  if (whole.reasoning != pieces.reasoning || whole.content != pieces.content) std::abort();
  if (whole.reasoning.size() + whole.content.size() > text.size()) std::abort();
  if (!text.ends_with(whole.content)) std::abort();
  if (text.find(whole.reasoning) == std::string_view::npos) std::abort();
  return 0;
}
