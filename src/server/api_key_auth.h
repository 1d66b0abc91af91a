// ApiKeyAuth: whether a request may use the server (`strata serve --api-key`). One decision,
// kept apart from the HTTP transport so that any transport asks it the same way: before routing,
// the transport passes the request's path and Authorization header and answers the returned
// error as it is (status 401, OpenAI-shaped body, plus `WWW-Authenticate: Bearer`).
//
// With a key, every path but the health probes (/health, /health_generate: load balancers and
// Kubernetes probe without credentials) needs `Authorization: Bearer KEY`. The key is compared
// in constant time (the time depends on the lengths only, never on where the bytes differ), and
// it is never put in an error message or a log line; neither is what the client sent.
//
// Thread-safe (immutable after construction); check() costs O(key length).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "core/status.h"
#include "server/openai_schema.h"

namespace strata {

class ApiKeyAuth {
 public:
  ApiKeyAuth() = default;  // no key: every request passes
  explicit ApiKeyAuth(std::string key) : key_(std::move(key)) {}

  bool enabled() const { return !key_.empty(); }
  // nullopt: the request may go on. `authorization`: the Authorization header's value, nullopt
  // when the request has none.
  std::optional<ApiError> check(std::string_view path,
                                std::optional<std::string_view> authorization) const;

 private:
  std::string key_;
};

// Whether a and b are equal, in time that depends on their lengths only.
bool constant_time_equal(std::string_view a, std::string_view b);

// A key must be printable ASCII without spaces (what an HTTP header can carry unchanged), at
// most 4096 bytes. `source` names where it came from in the error (never the key itself).
Status validate_api_key(std::string_view key, std::string_view source);

}  // namespace strata
