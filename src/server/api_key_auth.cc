#include "server/api_key_auth.h"

#include <algorithm>
#include <cctype>

namespace strata {
namespace {

constexpr size_t kMaxKeyBytes = 4096;

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool is_health_probe(std::string_view path) {
  return path == "/health" || path == "/health_generate";
}

// The token of `Bearer TOKEN` (scheme case-insensitive, RFC 7235), nullopt for anything else.
std::optional<std::string_view> bearer_token(std::string_view value) {
  value = trim(value);
  constexpr std::string_view kScheme = "bearer";
  if (value.size() <= kScheme.size() ||
      (value[kScheme.size()] != ' ' && value[kScheme.size()] != '\t'))
    return std::nullopt;
  for (size_t i = 0; i < kScheme.size(); ++i)
    if (char(std::tolower(static_cast<unsigned char>(value[i]))) != kScheme[i]) return std::nullopt;
  const std::string_view token = trim(value.substr(kScheme.size()));
  if (token.empty()) return std::nullopt;
  return token;
}

ApiError unauthorized(std::string message, std::string code) {
  return api_error(401, std::move(message), "invalid_request_error", "", std::move(code));
}

}  // namespace

bool constant_time_equal(std::string_view a, std::string_view b) {
  // volatile: the compiler must not turn the loop into an early exit at the first difference.
  volatile unsigned char diff = a.size() != b.size() ? 1 : 0;
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff = diff | (x ^ y);
  }
  return diff == 0;
}

Status validate_api_key(std::string_view key, std::string_view source) {
  if (key.empty()) return invalid_argument("{}: the API key is empty", source);
  if (key.size() > kMaxKeyBytes)
    return invalid_argument("{}: the API key is longer than {} bytes", source, kMaxKeyBytes);
  for (char c : key)
    if (c <= ' ' || c > '~')
      return invalid_argument(
          "{}: the API key must be printable ASCII without spaces (an HTTP header carries it)",
          source);
  return Status();
}

std::optional<ApiError> ApiKeyAuth::check(std::string_view path,
                                          std::optional<std::string_view> authorization) const {
  if (!enabled() || is_health_probe(path)) return std::nullopt;
  if (!authorization || trim(*authorization).empty())
    return unauthorized(
        "You didn't provide an API key. This server needs one in the Authorization header, using "
        "Bearer auth (Authorization: Bearer YOUR_KEY).",
        "");
  const std::optional<std::string_view> token = bearer_token(*authorization);
  if (!token)
    return unauthorized(
        "Malformed Authorization header: expected 'Authorization: Bearer YOUR_KEY'.",
        "invalid_api_key");
  if (!constant_time_equal(*token, key_))
    return unauthorized("Incorrect API key provided.", "invalid_api_key");
  return std::nullopt;
}

}  // namespace strata
