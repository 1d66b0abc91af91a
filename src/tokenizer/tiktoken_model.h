// Checkpoints that ship a tiktoken vocabulary (`tiktoken.model`: one "base64(token bytes) rank"
// line per token) instead of a tokenizer.json, as Moonshot's Kimi K2 / K2.5 and Moonlight do
// (their tokenization_kimi.py builds a tiktoken.Encoding from it, SGLang and vLLM run it with
// --trust-remote-code). No code is run here: the vocabulary is converted into the tokenizer.json
// that describes the same tokenizer, which the tokenizer then loads as any other.
//
// The conversion (as transformers' TikTokenConverter makes it):
//  - the vocabulary in the GPT-2 byte-level alphabet, each token's id its rank;
//  - merges: every split of a token into two tokens, ordered by the token's rank. tiktoken merges
//    the adjacent pair whose concatenation has the lowest rank; a merge list holding every such
//    pair ranked by its result makes the byte-level BPE merge the same pairs in the same order;
//  - the family's pre-tokenization pattern (the Python code's pat_str, which tokenizer_config.json
//    does not hold: the family is recognized by its tokenizer class), as a Split before a
//    ByteLevel without regex;
//  - the special tokens after the vocabulary: tokenizer_config.json's added_tokens_decoder names,
//    the other reserved ids `<|reserved_token_ID|>`, as tokenization_kimi.py names them.
#pragma once

#include <string>

#include "core/status.h"

namespace strata {

// Whether `model_dir` holds a tiktoken vocabulary (and no tokenizer.json).
bool has_tiktoken_model(const std::string& model_dir);

// The tokenizer.json text for `model_dir`'s tiktoken.model and tokenizer_config.json.
// InvalidArgument for a malformed vocabulary (the line named) or a tokenizer class whose
// pre-tokenization is not known (named, with the known ones).
StatusOr<std::string> tiktoken_tokenizer_json(const std::string& model_dir);

// Kimi's pat_str (tokenization_kimi.py) as written for tiktoken (Rust regex: `&&` intersects
// classes), and the same pattern for PCRE2, which has no class intersection: [X&&[^\p{Han}]]
// becomes (?:(?!\p{Han})[X]). Exposed for the tests that check the two split alike.
extern const char* const kKimiPatternTiktoken;
extern const char* const kKimiPatternPcre2;

}  // namespace strata
