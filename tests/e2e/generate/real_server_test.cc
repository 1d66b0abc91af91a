// `strata generate --server` against the real `strata serve` (house-llama, CPU), with the
// server killed (SIGKILL) mid-run and started again: the job rides through the outage and
// ends with every id exactly once; its greedy answers equal the in-process engine's. The generator
// starts before the server and says so while it waits.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "support/child_process.h"
#include "support/shared_prompts.h"

namespace strata {
namespace {

using testing_support::Child;
using testing_support::count_lines;
using testing_support::file_contains;
using testing_support::free_port;
using testing_support::read_file;
using testing_support::wait_for_lines;
using testing_support::wait_for_text;

constexpr int kPrompts = 120;
constexpr int kWaitMs = 120000;

std::map<std::string, std::string> answers(const std::string& path) {
  std::map<std::string, std::string> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    EXPECT_TRUE(out.emplace(j["id"], j["conversations"].back()["content"]).second)
        << "duplicate " << j["id"];
  }
  return out;
}

TEST(GenerateRealServer, ServerKilledAndRestartedMidRun) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("strata_real_server_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string input = (dir / "define.jsonl").string(), output = (dir / "out.jsonl").string(),
                    engine_output = (dir / "engine.jsonl").string(),
                    log = (dir / "log.txt").string();
  testing_support::write_shared_prompts(input, "define", kPrompts);
  const std::string model = testing_support::house_llama_path();
  const int port = free_port();
  const std::vector<std::string> serve = {
      STRATA_BINARY, "serve",     "--model-path", model,
      "--host",      "127.0.0.1", "--port",       std::to_string(port)};
  const std::vector<std::string> common = {
      "--input", "define=" + input, "--max-new-tokens", "6", "--temperature", "0", "--concurrency",
      "8"};
  std::vector<std::string> gen = {STRATA_BINARY,
                                  "generate",
                                  "--server",
                                  "http://127.0.0.1:" + std::to_string(port),
                                  "--output",
                                  output,
                                  "--retry-initial-delay",
                                  "0.05",
                                  "--retry-max-delay",
                                  "0.5",
                                  "--server-down-timeout",
                                  "60"};
  gen.insert(gen.end(), common.begin(), common.end());

  // The generator starts first: it says it is waiting (connections refused) and waits.
  Child g = Child::spawn(gen, log);
  ASSERT_FALSE(wait_for_text(g, dir.string(), log, "is unavailable").has_value())
      << "generator exited early";
  Child server = Child::spawn(serve, log);
  ASSERT_FALSE(wait_for_lines(g, dir.string(), output, 30).has_value()) << "generator exited early";
  server.kill9();
  const int64_t at_kill = count_lines(output);
  server = Child::spawn(serve, log);
  auto rc = g.wait_for(kWaitMs);
  ASSERT_EQ(rc.value_or(-1), 0) << read_file(log);
  EXPECT_LT(at_kill, kPrompts) << "the server was killed after the job ended";
  EXPECT_TRUE(file_contains(log, "answers again"))
      << "the generator did not say the server came back";

  const auto via_server = answers(output);
  EXPECT_EQ(int(via_server.size()), kPrompts);
  EXPECT_EQ(count_lines(output), kPrompts);

  // The same prompts through the in-process engine: greedy, so the same answers.
  std::vector<std::string> local = {STRATA_BINARY, "generate", "--model-path",
                                    model,         "--output", engine_output};
  local.insert(local.end(), common.begin(), common.end());
  ASSERT_TRUE(testing_support::runs_to_end(local, log, kWaitMs));
  const auto via_engine = answers(engine_output);
  int same = 0;
  for (const auto& [id, text] : via_engine)
    same += via_server.count(id) && via_server.at(id) == text;
  EXPECT_EQ(same, kPrompts);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace strata
