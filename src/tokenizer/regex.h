// A compiled PCRE2 pattern (UTF + UCP, JIT when available) for the tokenizer's Split
// pre-tokenizers and Replace normalizers. Hugging Face tokenizers use Oniguruma; PCRE2 accepts
// the same syntax for every pattern seen in hub tokenizer.json files ((?i:...), \p{L}, (?!\S)).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"

namespace strata::tok {

// Byte offsets [begin, end) into the searched text.
using ByteRange = std::pair<size_t, size_t>;

// Immutable after compile(); find_all() is thread-safe (per-thread match data and JIT stack).
class Regex {
 public:
  // Errors name the pattern and PCRE2's message with its offset.
  static StatusOr<Regex> compile(std::string_view pattern);

  // Appends the successive non-overlapping matches in `text` (which must be valid UTF-8).
  // Empty matches are skipped. Cost: linear in the text for tokenizer-style patterns.
  void find_all(std::string_view text, std::vector<ByteRange>* out) const;

  // True when the pattern matches anywhere in `text` (valid UTF-8).
  bool search(std::string_view text) const;

  const std::string& pattern() const { return pattern_; }

 private:
  struct Code;
  std::shared_ptr<const Code> code_;
  std::string pattern_;
};

}  // namespace strata::tok

namespace strata::tok {

// The `pattern` of Split / Replace in tokenizer.json: {"String": "..."} matches literally,
// {"Regex": "..."} is a regex. Immutable; thread-safe.
class Pattern {
 public:
  static Pattern literal(std::string text);
  static StatusOr<Pattern> regex(std::string_view pattern);

  // Appends the non-overlapping, non-empty matches in `text` (valid UTF-8), left to right.
  void find_all(std::string_view text, std::vector<ByteRange>* out) const;

 private:
  bool is_regex_ = false;
  std::string literal_;
  Regex regex_;
};

}  // namespace strata::tok
