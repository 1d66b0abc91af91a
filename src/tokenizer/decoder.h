// Decoders of tokenizer.json ("decoder"): token strings -> text. Supported: Sequence, ByteLevel,
// ByteFallback, Fuse, Strip, Replace, Metaspace. Each step maps a list of strings to a list of
// strings (Hugging Face's decode_chain); the result is their concatenation.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tokenizer/json_util.h"

namespace strata::tok {

// Immutable after construction; decode_chain() is thread-safe.
class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void decode_chain(std::vector<std::string>* tokens) const = 0;
  // True when "<0xNN>" tokens are joined into runs whose text depends on the whole run (an
  // invalid run becomes one U+FFFD per byte, so a later byte can change earlier text).
  virtual bool joins_byte_runs() const { return false; }
};

// null -> nullptr. Unknown types -> Unimplemented.
StatusOr<std::unique_ptr<Decoder>> make_decoder(const Json& j, std::string_view where);

}  // namespace strata::tok
