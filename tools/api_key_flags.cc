#include "api_key_flags.h"

#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "core/log.h"
#include "server/api_key_auth.h"

namespace strata::tools {
namespace {

std::string trim_whitespace(std::string s) {
  const char* ws = " \t\r\n";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

StatusOr<std::string> read_key_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found("--api-key-file '{}' cannot be read", path);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string key = trim_whitespace(ss.str());
  STRATA_RETURN_IF_ERROR(validate_api_key(key, fmt::format("--api-key-file '{}'", path)));
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && (st.st_mode & (S_IRGRP | S_IROTH)) != 0)
    LOG_WARN("--api-key-file '{}' is readable by other users (chmod 600 it)", path);
  return key;
}

}  // namespace

void add_api_key_flags(CLI::App& app, ApiKeyFlags& f, const std::string& what) {
  app.add_option("--api-key", f.key,
                 "API key " + what + " (default: $" + kApiKeyEnv +
                     "; a key on the command line shows in ps: prefer " +
                     "--api-key-file or the variable)");
  app.add_option("--api-key-file", f.file,
                 "file holding the API key (one line), instead of --api-key");
}

StatusOr<std::string> resolve_api_key(const ApiKeyFlags& f) {
  if (!f.key.empty() && !f.file.empty())
    return invalid_argument("--api-key and --api-key-file both given: give one");
  if (!f.key.empty()) {
    STRATA_RETURN_IF_ERROR(validate_api_key(f.key, "--api-key"));
    return f.key;
  }
  if (!f.file.empty()) return read_key_file(f.file);
  const char* env = std::getenv(kApiKeyEnv);
  if (env == nullptr || *env == '\0') return std::string();
  STRATA_RETURN_IF_ERROR(validate_api_key(env, std::string("$") + kApiKeyEnv));
  return std::string(env);
}

}  // namespace strata::tools
