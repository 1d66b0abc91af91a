// Hugging Face tokenizer.json tokenizer: byte-level BPE (GPT-2 / Llama-3 / Qwen style, Split
// regex pre-tokenizers) and SentencePiece-style BPE (Llama-2 / Mistral: Replace+Prepend or
// Metaspace, byte_fallback), with added/special tokens and the matching decoders.
//
// Thread-safety: a loaded Tokenizer is immutable apart from an internal, mutex-guarded BPE word
// cache, so every const method may be called from many threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace strata {

namespace tok {
class AddedVocab;
class BpeModel;
class Decoder;
class Normalizer;
class PreTokenizer;
}  // namespace tok

// Special-token names from tokenizer_config.json (absent fields stay empty / nullopt).
struct SpecialTokens {
  std::optional<std::string> bos_token, eos_token, pad_token, unk_token;
  std::optional<int32_t> bos_id, eos_id, pad_id, unk_id;  // resolved against the vocabulary
};

class Tokenizer {
 public:
  // Reads <model_dir>/tokenizer.json and, when present, <model_dir>/tokenizer_config.json.
  // Errors: NotFound (no tokenizer.json), InvalidArgument (malformed JSON or fields, naming the
  // file and field), Unimplemented (a model/normalizer/pre-tokenizer/decoder type we lack).
  static StatusOr<Tokenizer> load(const std::string& model_dir);
  // The same from text; `source` names the input in error messages. `config_json` is the text of
  // tokenizer_config.json or empty.
  static StatusOr<Tokenizer> from_json_text(std::string_view tokenizer_json,
                                            std::string_view config_json = {},
                                            std::string_view source = "tokenizer.json");

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Text -> ids, without the post-processor's BOS/EOS (Hugging Face's
  // add_special_tokens=False, which is what chat templates expect). With allow_special=false,
  // special added tokens in the text are encoded as plain text (use for untrusted user text).
  // Invalid UTF-8 in `text` is replaced with U+FFFD first. Cost: linear in the text, plus BPE on
  // words missing from the cache.
  std::vector<int32_t> encode(std::string_view text, bool allow_special = true) const;

  // Applies the post-processor's single-sequence template (e.g. Llama's "<s> $A"), as Hugging
  // Face's add_special_tokens=True does. ByteLevel/absent post-processors return ids unchanged.
  std::vector<int32_t> with_special_tokens(std::span<const int32_t> ids) const;

  // Ids -> text through the decoder. Unknown ids are skipped. Always valid UTF-8 (invalid byte
  // sequences become U+FFFD).
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;
  // skip_special with exceptions: the special tokens in `keep_special` are decoded (a reasoning
  // parser's tags, tokenizer/reasoning_parser.h).
  std::string decode(std::span<const int32_t> ids, bool skip_special,
                     std::span<const int32_t> keep_special) const;

  // One past the largest id (model vocabulary and added tokens).
  int64_t vocab_size() const;
  std::optional<int32_t> token_to_id(std::string_view token) const;
  // The raw vocabulary string (e.g. "Ġworld"); empty for unknown ids.
  std::string id_to_token(int32_t id) const;
  bool is_special(int32_t id) const;
  // A "<0xNN>" piece of a ByteFallback decoder: text around it is final only once its byte run
  // has ended (StreamDecoder holds back until then).
  bool is_byte_fallback_piece(int32_t id) const;
  // Ids of every special added token.
  std::vector<int32_t> special_ids() const;

  const SpecialTokens& special_tokens() const { return special_; }
  std::optional<std::string> bos_token() const { return special_.bos_token; }
  std::optional<std::string> eos_token() const { return special_.eos_token; }
  std::optional<int32_t> bos_id() const { return special_.bos_id; }
  std::optional<int32_t> eos_id() const { return special_.eos_id; }

 private:
  Tokenizer();
  Status parse_config(std::string_view config_json, std::string_view source);
  void encode_plain(std::string_view text, bool at_start, std::vector<int32_t>* ids) const;

  std::unique_ptr<tok::Normalizer> normalizer_;
  std::unique_ptr<tok::PreTokenizer> pre_tokenizer_;
  std::unique_ptr<tok::BpeModel> model_;
  std::unique_ptr<tok::Decoder> decoder_;
  std::unique_ptr<tok::AddedVocab> added_;
  std::vector<int32_t> added_slot_;       // [vocab_size] index into added tokens, -1 if none
  std::vector<int32_t> template_prefix_;  // post-processor ids before the sequence
  std::vector<int32_t> template_suffix_;  // and after it
  SpecialTokens special_;
};

// Incremental detokenizer for streaming: push ids one at a time and get back only text that is
// final (never a partial UTF-8 character; decoders that look at neighbouring tokens, like
// SentencePiece's leading-space strip, see the same context as a full decode). The pieces
// concatenate to decode(all ids). Not thread-safe; one per stream. The Tokenizer must outlive it.
class StreamDecoder {
 public:
  // `keep_special`: special tokens decoded even when skip_special (Tokenizer::decode).
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special = true,
                         std::vector<int32_t> keep_special = {});

  // Returns the newly final text (possibly empty). Cost: decodes a short window of recent ids.
  std::string push(int32_t id);
  // Flushes what is still held back (an unfinished character becomes U+FFFD).
  std::string finish();

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_;
  std::vector<int32_t> keep_special_;
  std::vector<int32_t> ids_;  // window: anchor ids, context ids, then ids not yet emitted
  std::string prefix_;        // decode of ids_[0, context_end_)
  size_t anchor_len_ = 0;     // ids_[0, anchor_len_): the stream's first ids (0: not yet known)
  size_t context_end_ = 0;    // ids_[anchor_len_, context_end_) are context
};

}  // namespace strata
