// Python str operations the chat-template builtins need, on UTF-8 text. Case mapping is ASCII-only
// (chat templates upper/lower role names and keywords, not prose).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace strata::jinja {

// Python str.isspace() for one code point.
bool py_isspace(uint32_t cp);
// str.strip/lstrip/rstrip; `chars` nullopt means whitespace.
std::string py_strip(std::string_view s, const std::optional<std::string>& chars, bool left,
                     bool right);
// str.split(sep, maxsplit) / str.rsplit; sep nullopt splits on whitespace runs. sep must be
// non-empty.
std::vector<std::string> py_split(std::string_view s, const std::optional<std::string>& sep,
                                  int64_t maxsplit, bool from_right);
// str.splitlines() (on \n, \r\n and \r).
std::vector<std::string> py_splitlines(std::string_view s);
std::string ascii_upper(std::string_view s);
std::string ascii_lower(std::string_view s);
// str.capitalize(): first character upper, the rest lower.
std::string py_capitalize(std::string_view s);
// str.title(): upper after any non-letter, lower elsewhere.
std::string py_title(std::string_view s);
// Jinja's |title filter: words split on whitespace and -({[< .
std::string jinja_title(std::string_view s);
// str.replace(old, new, count); count < 0 replaces all.
std::string py_replace(std::string_view s, std::string_view old, std::string_view replacement,
                       int64_t count);
// Size str.replace would produce, without building it (so limits are checked first).
size_t py_replace_size(std::string_view s, std::string_view old, std::string_view replacement,
                       int64_t count);
// Code-point index of `sub` in s (str.find / rfind), -1 when absent.
int64_t py_find(std::string_view s, std::string_view sub, bool from_right);
// Non-overlapping occurrences (str.count).
int64_t py_count(std::string_view s, std::string_view sub);
// markupsafe.escape: & < > " ' as HTML entities.
std::string html_escape(std::string_view s);

}  // namespace strata::jinja
