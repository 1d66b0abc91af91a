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
};

// null -> nullptr. Unknown types -> Unimplemented.
StatusOr<std::unique_ptr<Decoder>> make_decoder(const Json& j, std::string_view where);

}  // namespace strata::tok
