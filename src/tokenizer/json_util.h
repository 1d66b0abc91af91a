// Small typed readers for tokenizer.json fields: they turn a missing or mistyped field into a
// Status naming the field instead of a nlohmann exception.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "core/status.h"
#include "tokenizer/regex.h"

namespace strata::tok {

using Json = nlohmann::json;

// `where` is the field path used in messages, e.g. "pre_tokenizer.pretokenizers[1]".
StatusOr<std::string> json_string(const Json& j, const char* key, std::string_view where);
// Missing or null -> `fallback`.
StatusOr<std::string> json_string_or(const Json& j, const char* key, std::string fallback,
                                     std::string_view where);
StatusOr<bool> json_bool_or(const Json& j, const char* key, bool fallback, std::string_view where);
StatusOr<int64_t> json_int_or(const Json& j, const char* key, int64_t fallback,
                              std::string_view where);
// A field holding exactly one code point (Metaspace replacement, Strip content).
StatusOr<std::string> json_char(const Json& j, const char* key, std::string_view where);
// {"String": s} or {"Regex": r}.
StatusOr<Pattern> json_pattern(const Json& j, std::string_view where);

}  // namespace strata::tok
