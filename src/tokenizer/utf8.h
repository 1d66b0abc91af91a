// UTF-8 helpers and the GPT-2 byte-level alphabet, shared by the tokenizer pieces.
// All functions are pure and thread-safe.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace strata::tok {

inline constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

// Scans one UTF-8 sequence at text[pos]. Returns its length (1..4) when it is complete and
// well-formed, or the negated length of the maximal invalid subpart (Unicode's "substitution of
// maximal subparts", what Rust's from_utf8_lossy and Python's decode("replace") use).
int utf8_scan(std::string_view text, size_t pos);

bool is_valid_utf8(std::string_view text);

// Replaces every maximal invalid subpart with U+FFFD; valid text is returned unchanged.
std::string to_valid_utf8(std::string_view text);

// Length of the longest prefix of `text` that does not end inside a multi-byte sequence that
// could still be completed by more bytes. Used by streaming to hold back a partial character.
size_t utf8_complete_prefix_len(std::string_view text);

// Decodes the code point at text[*pos] of VALID UTF-8 and advances *pos.
char32_t next_code_point(std::string_view text, size_t* pos);

void append_utf8(char32_t cp, std::string* out);

// Unicode White_Space (what Rust's char::is_whitespace and regex \s accept).
bool is_unicode_whitespace(char32_t cp);

// GPT-2 byte-level alphabet: byte -> UTF-8 of its printable stand-in character.
const std::array<std::string, 256>& byte_to_unicode();

// Inverse of byte_to_unicode: code point -> byte, or -1 when cp is not in the alphabet.
int unicode_to_byte(char32_t cp);

}  // namespace strata::tok
