// The API key flags of `strata serve` (the key clients must send) and `strata generate --server`
// (the key it sends): --api-key KEY, --api-key-file FILE, or $STRATA_API_KEY. A key on the
// command line shows in `ps` and in shell history; the file or the variable keeps it out of both.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "core/status.h"

namespace strata::tools {

inline constexpr const char* kApiKeyEnv = "STRATA_API_KEY";

struct ApiKeyFlags {
  std::string key;
  std::string file;
};

// Registers --api-key and --api-key-file; `what` ends their help ("clients must send", ...).
void add_api_key_flags(CLI::App& app, ApiKeyFlags& flags, const std::string& what);

// The key: --api-key, else the contents of --api-key-file (surrounding whitespace and the final
// newline dropped), else $STRATA_API_KEY, else "" (no key). Both flags at once is an error; so is
// an empty or unreadable file or a key an HTTP header cannot carry. Errors never quote the key.
// Logs a warning when the key file is readable by other users.
StatusOr<std::string> resolve_api_key(const ApiKeyFlags& flags);

}  // namespace strata::tools
