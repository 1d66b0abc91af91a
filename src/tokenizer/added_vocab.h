// Added tokens of tokenizer.json ("added_tokens"): matched in the text before pre-tokenization,
// leftmost-longest like Hugging Face's AddedVocabulary, honouring lstrip / rstrip / single_word.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/normalizer.h"

namespace strata::tok {

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
  bool normalized = false;  // matched against the normalized text (content normalized too)
};

// A piece of text: either plain text (id == -1) or one added token (the span includes any
// whitespace its lstrip/rstrip swallowed).
struct TextSpan {
  size_t begin = 0;
  size_t end = 0;
  int32_t id = -1;
};

// Immutable after build(); split() is thread-safe.
class AddedVocab {
 public:
  // `normalizer` (may be null) is applied to the content of normalized tokens.
  void build(std::vector<AddedToken> tokens, const Normalizer* normalizer);

  // Covers `text` with spans, matching the non-normalized tokens (normalized_set = false) or the
  // normalized ones. With allow_special = false, special tokens are not matched (their text is
  // tokenized as ordinary text). Empty text yields no spans.
  void split(std::string_view text, bool normalized_set, bool allow_special,
             std::vector<TextSpan>* out) const;

  bool has_normalized_tokens() const { return !normalized_.patterns.empty(); }
  const AddedToken* by_id(int32_t id) const;
  std::optional<int32_t> id_of(std::string_view content) const;
  const std::vector<AddedToken>& tokens() const { return tokens_; }

 private:
  struct Matcher {
    struct Entry {
      std::string text;
      size_t token;  // index into tokens_
    };
    std::vector<Entry> patterns;
    std::array<std::vector<uint32_t>, 256> by_first_byte;  // pattern indices, longest first
  };
  static void index(Matcher* m);
  // Longest allowed pattern matching at text[pos], or nullptr.
  const Matcher::Entry* match_at(const Matcher& m, std::string_view text, size_t pos,
                                 bool allow_special) const;

  std::vector<AddedToken> tokens_;
  Matcher raw_, normalized_;
};

}  // namespace strata::tok
