// strata serve --api-key end to end: every endpoint but the health probes answers 401 (OpenAI-
// shaped, WWW-Authenticate: Bearer) without the key, with a wrong one or a malformed header, and
// as usual with it; the key reaches the server through $STRATA_API_KEY or --api-key-file as well
// as --api-key; `strata generate --server` sends it; and neither the key nor a wrong one a client
// sent appears in the server's log (debug level, --log-requests) or in /get_server_info.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "server_process.h"

namespace strata::e2e {
namespace {

using nlohmann::json;

const std::string kKey = "sk-strata-e2e-Q7v2c9XfK1";
const std::string kWrongKey = "sk-strata-e2e-wrongW8z3";

std::vector<std::string> bearer(const std::string& key) { return {"Authorization: Bearer " + key}; }

struct Endpoint {
  const char* method;
  const char* path;
  const char* body;
  int status_with_key;
};
const Endpoint kEndpoints[] = {
    {"GET", "/v1/models", "", 200},
    {"GET", "/v1/models/house-llama", "", 200},
    {"GET", "/get_server_info", "", 200},
    {"GET", "/server_info", "", 200},
    {"GET", "/get_model_info", "", 200},
    {"GET", "/metrics", "", 200},
    {"GET", "/flush_cache", "", 200},
    {"POST", "/flush_cache", "", 200},
    {"POST", "/v1/completions", R"({"prompt":"The kernel","max_tokens":2})", 200},
    {"POST", "/v1/chat/completions",
     R"({"messages":[{"role":"user","content":"Hi"}],"max_tokens":2})", 200},
    {"POST", "/generate", R"({"text":"The kernel","sampling_params":{"max_new_tokens":2}})", 200},
    {"POST", "/tokenize", R"({"prompt":"The kernel"})", 200},
    {"GET", "/no/such/endpoint", "", 404},
};

void expect_401(const HttpResponse& r, const std::string& what) {
  SCOPED_TRACE(what);
  EXPECT_EQ(r.status, 401) << r.body;
  auto it = r.headers.find("www-authenticate");
  EXPECT_TRUE(it != r.headers.end() && it->second == "Bearer");
  const json j = json::parse(r.body, nullptr, false);
  ASSERT_TRUE(j.is_object() && j.contains("error")) << r.body;
  const json& e = j["error"];
  EXPECT_TRUE(e.contains("message") && e.contains("type") && e.contains("param") &&
              e.contains("code"))
      << r.body;
  EXPECT_EQ(e["type"], "invalid_request_error");
  EXPECT_EQ(r.body.find(kKey), std::string::npos);
  EXPECT_EQ(r.body.find(kWrongKey), std::string::npos);
}

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "strata_api_key_" + std::to_string(::getpid()) + "_" + name;
}

std::string write_key_file(const std::string& name, const std::string& contents) {
  const std::string path = temp_path(name);
  std::ofstream(path) << contents;
  ::chmod(path.c_str(), 0600);
  return path;
}

std::string generate_cmd(int port, const std::string& key_flags) {
  return std::string(STRATA_BINARY) +
         " generate --server http://127.0.0.1:" + std::to_string(port) +
         " --prompt 'What is a kernel?' --max-new-tokens 3 --temperature 0 --max-attempts 1 " +
         key_flags;
}

// The key from $STRATA_API_KEY: every endpoint, and generate --server with and without it.
TEST(ServeApiKeyTest, EveryEndpointButHealthNeedsTheKey) {
  ServerProcess server;
  server.set_env("STRATA_API_KEY", kKey);
  ASSERT_TRUE(server.start({"--log-level", "debug", "--log-requests"})) << server.log();
  const int port = server.port();
  EXPECT_NE(server.log().find("API key required"), std::string::npos) << server.log();
  for (const char* path : {"/health", "/health_generate"})
    EXPECT_EQ(http(port, "GET", path).status, 200) << path;
  for (const Endpoint& ep : kEndpoints) {
    const std::string what = std::string(ep.method) + " " + ep.path;
    expect_401(http(port, ep.method, ep.path, ep.body), what + " without a key");
    expect_401(http(port, ep.method, ep.path, ep.body, 30, bearer(kWrongKey)),
               what + " with a wrong key");
    expect_401(http(port, ep.method, ep.path, ep.body, 30, bearer(kKey + "x")),
               what + " with a longer key");
    expect_401(http(port, ep.method, ep.path, ep.body, 30, {"Authorization: Basic " + kKey}),
               what + " Basic");
    expect_401(http(port, ep.method, ep.path, ep.body, 30, {"Authorization: Bearer"}),
               what + " Bearer alone");
    const HttpResponse ok = http(port, ep.method, ep.path, ep.body, 60, bearer(kKey));
    EXPECT_EQ(ok.status, ep.status_with_key) << what << ": " << ok.body;
  }
  // /get_server_info reports the launch flags; the key is not among them.
  const HttpResponse info = http(port, "GET", "/get_server_info", "", 30, bearer(kKey));
  EXPECT_EQ(info.body.find(kKey), std::string::npos) << info.body;

  std::string out;
  EXPECT_EQ(run_command(generate_cmd(port, "--api-key " + kKey), &out), 0) << out;
  EXPECT_FALSE(out.empty());
  EXPECT_EQ(run_command("STRATA_API_KEY=" + kKey + " " + generate_cmd(port, ""), &out), 0) << out;
  const std::string key_file = write_key_file("client_key", kKey + "\n");
  EXPECT_EQ(run_command(generate_cmd(port, "--api-key-file " + key_file), &out), 0) << out;
  EXPECT_NE(run_command("env -u STRATA_API_KEY " + generate_cmd(port, ""), &out), 0) << out;
  EXPECT_NE(out.find("401"), std::string::npos) << out;
  EXPECT_NE(run_command(generate_cmd(port, "--api-key " + kWrongKey), &out), 0) << out;
  EXPECT_NE(out.find("Incorrect API key"), std::string::npos) << out;
  EXPECT_EQ(out.find(kWrongKey), std::string::npos) << out;

  EXPECT_EQ(server.stop(), 0) << server.log();
  const std::string log = server.log();
  EXPECT_NE(log.find("/v1/completions"), std::string::npos) << "--log-requests logged nothing:\n"
                                                            << log;
  EXPECT_EQ(log.find(kKey), std::string::npos) << "the key is in the server's log:\n" << log;
  EXPECT_EQ(log.find(kWrongKey), std::string::npos)
      << "a client's wrong key is in the server's log:\n"
      << log;
  std::filesystem::remove(key_file);
}

TEST(ServeApiKeyTest, KeyFromAFile) {
  const std::string key_file = write_key_file("server_key", "  " + kKey + "\n");
  ServerProcess server;
  ASSERT_TRUE(server.start({"--api-key-file", key_file})) << server.log();
  expect_401(http(server.port(), "GET", "/v1/models"), "no key");
  EXPECT_EQ(http(server.port(), "GET", "/v1/models", "", 30, bearer(kKey)).status, 200);
  EXPECT_EQ(server.stop(), 0) << server.log();
  EXPECT_EQ(server.log().find(kKey), std::string::npos) << server.log();
  std::filesystem::remove(key_file);
}

TEST(ServeApiKeyTest, UnusableKeysAreStartupErrors) {
  const std::string base =
      std::string(STRATA_BINARY) + " serve --model-path " + house_llama() + " --port 0 ";
  const std::string empty_file = write_key_file("empty", "\n"),
                    two_lines = write_key_file("two", "a\nb\n");
  const std::pair<std::string, std::string> cases[] = {
      {"--api-key " + kKey + " --api-key-file " + empty_file, "both given"},
      {"--api-key-file " + empty_file, "the API key is empty"},
      {"--api-key-file " + two_lines, "printable ASCII without spaces"},
      {"--api-key-file " + temp_path("missing"), "cannot be read"},
      {"--api-key 'two words'", "printable ASCII without spaces"},
  };
  for (const auto& [flags, needle] : cases) {
    std::string out;
    EXPECT_EQ(run_command(base + flags, &out), 1) << flags << ": " << out;
    EXPECT_NE(out.find(needle), std::string::npos) << flags << ": " << out;
    EXPECT_EQ(out.find(kKey), std::string::npos) << flags << ": " << out;
  }
  std::filesystem::remove(empty_file);
  std::filesystem::remove(two_lines);
}

}  // namespace
}  // namespace strata::e2e
