// Pre-tokenizers of tokenizer.json ("pre_tokenizer"): split normalized text into words that the
// model encodes independently. Supported: Sequence, Split (regex or string; Removed, Isolated,
// MergedWithPrevious, MergedWithNext, Contiguous; invert), ByteLevel, Metaspace, Digits.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tokenizer/json_util.h"

namespace strata::tok {

struct Word {
  std::string text;
  bool at_start = false;  // begins at offset 0 of the original input (Metaspace "first")
};

// Immutable after construction; pre_tokenize() is thread-safe.
class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces *words with its refinement; empty words are dropped.
  virtual void pre_tokenize(std::vector<Word>* words) const = 0;
};

// null -> nullptr. Unknown types -> Unimplemented.
StatusOr<std::unique_ptr<PreTokenizer>> make_pre_tokenizer(const Json& j, std::string_view where);

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// Splits `text` at `matches` the way Hugging Face's NormalizedString::split does; appends the
// resulting non-empty [begin, end) pieces. Exposed for tests.
void split_by_matches(size_t text_size, const std::vector<ByteRange>& matches, bool invert,
                      SplitBehavior behavior, std::vector<ByteRange>* pieces);

// Maps every byte of `text` to its GPT-2 byte-level stand-in character.
std::string byte_level_encode(std::string_view text);

}  // namespace strata::tok
