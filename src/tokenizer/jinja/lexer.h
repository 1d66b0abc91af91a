// Jinja lexer for chat templates, configured as Hugging Face's chat-template environment is:
// trim_blocks=True (one newline after a block or comment tag is dropped), lstrip_blocks=True
// (spaces and tabs before a block or comment tag at the start of a line are dropped),
// keep_trailing_newline=False, newlines normalized to "\n". Comments vanish here; {% raw %} bodies
// become text.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace strata::jinja {

enum class TokenType {
  kText,        // literal template text, whitespace control already applied
  kVarBegin,    // {{
  kVarEnd,      // }}
  kBlockBegin,  // {%
  kBlockEnd,    // %}
  kName,
  kString,  // text holds the unescaped value
  kInt,
  kFloat,
  kOp,  // text holds the operator: "+", "//", "==", "(", ...
  kEof,
};

struct Token {
  TokenType type = TokenType::kEof;
  std::string text;
  int64_t int_value = 0;
  double float_value = 0;
  int line = 1;
};

// Splits a template into tokens. InvalidArgument (with the line) for an unclosed tag, comment or
// string, or a character no token starts with. Pure function; cost is linear in the source size.
StatusOr<std::vector<Token>> tokenize(std::string_view source);

}  // namespace strata::jinja
