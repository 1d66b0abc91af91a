// Runs the Node tests in tests/e2e/js (the official `openai` npm client) against a real
// `strata serve`, one test file per server configuration. Fails, saying why, when node or the
// npm packages are not installed (`npm ci` in tests/e2e/js; scripts/setup.sh does it): a skip
// would count as passed in ctest, so a CI machine whose npm install went wrong would never run
// the real client.
#include <gtest/gtest.h>

#include <filesystem>

#include "scripted_model.h"
#include "server_process.h"
#include "support/temp_dir.h"

namespace strata::e2e {
namespace {

// Checks that node and the npm packages are there (a clear failure when not).
void expect_node_ready(const std::filesystem::path& js_dir) {
  std::string out;
  ASSERT_EQ(run_command("command -v node", &out), 0)
      << "node is not installed (scripts/setup.sh installs it: apt-get install nodejs npm)";
  ASSERT_TRUE(std::filesystem::exists(js_dir / "node_modules" / "openai" / "package.json"))
      << "the openai npm package is missing from " << (js_dir / "node_modules")
      << ": run `npm ci` in " << js_dir << " (scripts/setup.sh does it)";
}

// The source tree's path, not __FILE__ (relative to the build directory, while ctest runs the
// test from build/tests).
std::filesystem::path js_dir() {
  return std::filesystem::path(STRATA_SOURCE_DIR) / "tests" / "e2e" / "js";
}

TEST(ServeNodeClientTest, OfficialOpenAiClient) {
  ASSERT_NO_FATAL_FAILURE(expect_node_ready(js_dir()));
  ServerProcess server;
  ASSERT_TRUE(server.start({})) << server.log();
  const std::string cmd = "cd '" + js_dir().string() +
                          "' && STRATA_BASE_URL=http://127.0.0.1:" + std::to_string(server.port()) +
                          "/v1 STRATA_BINARY='" + STRATA_BINARY + "' STRATA_MODEL_PATH='" +
                          house_llama() + "' node --test openai_client.test.mjs";
  std::string out;
  const int rc = run_command(cmd, &out);
  std::printf("%s\n", out.c_str());
  EXPECT_EQ(rc, 0) << out;
  EXPECT_EQ(server.stop(), 0) << server.log();
}

// --api-key with the client's apiKey option (api_key.test.mjs).
TEST(ServeNodeClientTest, OfficialClientApiKey) {
  ASSERT_NO_FATAL_FAILURE(expect_node_ready(js_dir()));
  const std::string key = "sk-node-e2e-4PzQ8r";
  ServerProcess server;
  server.set_env("STRATA_API_KEY", key);
  ASSERT_TRUE(server.start({})) << server.log();
  const std::string cmd = "cd '" + js_dir().string() +
                          "' && STRATA_BASE_URL=http://127.0.0.1:" + std::to_string(server.port()) +
                          "/v1 STRATA_TEST_API_KEY='" + key + "' node --test api_key.test.mjs";
  std::string out;
  const int rc = run_command(cmd, &out);
  std::printf("%s\n", out.c_str());
  EXPECT_EQ(rc, 0) << out;
  EXPECT_EQ(server.stop(), 0) << server.log();
  EXPECT_EQ(server.log().find(key), std::string::npos) << server.log();
}

// --tool-call-parser with the client's tool helpers (tool_calls.test.mjs), on house-llama with a
// token renamed to a Qwen-style call.
TEST(ServeNodeClientTest, OfficialClientToolCalls) {
  ASSERT_NO_FATAL_FAILURE(expect_node_ready(js_dir()));
  const testing::TempDir dir("strata_node_tools");
  const ScriptedModel model = make_scripted_model(
      dir.str(),
      {R"(<tool_call>{"name":"get_weather","arguments":{"city":"Paris","unit":"c"}}</tool_call>)"});
  ServerProcess server;
  server.set_model_path(model.dir);
  ASSERT_TRUE(server.start({"--served-model-name", "house-llama", "--tool-call-parser", "qwen25"}))
      << server.log();
  const std::string cmd = "cd '" + js_dir().string() +
                          "' && STRATA_BASE_URL=http://127.0.0.1:" + std::to_string(server.port()) +
                          "/v1 STRATA_CALL_TOKEN=" + std::to_string(model.ids[0]) +
                          " node --test tool_calls.test.mjs";
  std::string out;
  const int rc = run_command(cmd, &out);
  std::printf("%s\n", out.c_str());
  EXPECT_EQ(rc, 0) << out;
  EXPECT_EQ(server.stop(), 0) << server.log();
}

}  // namespace
}  // namespace strata::e2e
