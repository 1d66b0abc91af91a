#include "tokenizer/json_util.h"

#include "tokenizer/utf8.h"

namespace strata::tok {

StatusOr<std::string> json_string(const Json& j, const char* key, std::string_view where) {
  auto it = j.find(key);
  if (it == j.end()) return invalid_argument("{}: missing field '{}'", where, key);
  if (!it->is_string()) return invalid_argument("{}.{} must be a string", where, key);
  return it->get<std::string>();
}

StatusOr<std::string> json_string_or(const Json& j, const char* key, std::string fallback,
                                     std::string_view where) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_string()) return invalid_argument("{}.{} must be a string", where, key);
  return it->get<std::string>();
}

StatusOr<bool> json_bool_or(const Json& j, const char* key, bool fallback, std::string_view where) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) return invalid_argument("{}.{} must be a boolean", where, key);
  return it->get<bool>();
}

StatusOr<int64_t> json_int_or(const Json& j, const char* key, int64_t fallback,
                              std::string_view where) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_number_integer()) return invalid_argument("{}.{} must be an integer", where, key);
  return it->get<int64_t>();
}

StatusOr<std::string> json_char(const Json& j, const char* key, std::string_view where) {
  STRATA_ASSIGN_OR_RETURN(std::string s, json_string(j, key, where));
  if (s.empty() || !is_valid_utf8(s) || size_t(utf8_scan(s, 0)) != s.size()) {
    return invalid_argument("{}.{} must be a single character, got '{}'", where, key, s);
  }
  return s;
}

StatusOr<Pattern> json_pattern(const Json& j, std::string_view where) {
  auto it = j.find("pattern");
  if (it == j.end() || !it->is_object()) {
    return invalid_argument("{}.pattern must be an object {{\"String\"|\"Regex\": ...}}", where);
  }
  if (auto s = it->find("String"); s != it->end() && s->is_string()) {
    return Pattern::literal(s->get<std::string>());
  }
  if (auto r = it->find("Regex"); r != it->end() && r->is_string()) {
    auto p = Pattern::regex(r->get<std::string>());
    if (!p.ok()) return p.status().with_context("{}.pattern", where);
    return p;
  }
  return invalid_argument("{}.pattern must hold \"String\" or \"Regex\"", where);
}

}  // namespace strata::tok
