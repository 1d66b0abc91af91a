// Normalizers of tokenizer.json ("normalizer"): text -> text before pre-tokenization.
// Supported: Sequence, Replace, Prepend, Strip, NFC (pass-through, see below).
#pragma once

#include <memory>
#include <string>

#include "tokenizer/json_util.h"

namespace strata::tok {

// Immutable after construction; normalize() is thread-safe.
class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void normalize(std::string* text) const = 0;
};

// Builds the normalizer described by `j` (null -> nullptr). Unknown types -> Unimplemented.
StatusOr<std::unique_ptr<Normalizer>> make_normalizer(const Json& j, std::string_view where);

// Replaces every match of `pattern` with `content` (shared with the Replace decoder).
std::string replace_all(const Pattern& pattern, std::string_view text, std::string_view content);

}  // namespace strata::tok
