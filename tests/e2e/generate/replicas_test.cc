// `strata generate --server A,B` over two real `strata serve` replicas (house-llama, CPU), one of
// them killed with SIGKILL while requests are in flight on it: the job goes on with the other,
// retries the killed replica's requests there, says which replica is down on its progress line,
// and ends with every id exactly once and nothing failed.
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

constexpr int kPrompts = 160;
constexpr int kWaitMs = 120000;

TEST(GenerateReplicas, OneOfTwoReplicasKilledMidJobEveryIdOnce) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("strata_replicas_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string input = (dir / "define.jsonl").string(), output = (dir / "out.jsonl").string(),
                    log = (dir / "log.txt").string(), serve_log = (dir / "serve.txt").string();
  testing_support::write_shared_prompts(input, "define", kPrompts);
  const std::string model = testing_support::house_llama_path();
  const int port_a = free_port(), port_b = free_port();
  auto serve = [&](int port) {
    return Child::spawn({STRATA_BINARY, "serve", "--model-path", model, "--host", "127.0.0.1",
                         "--port", std::to_string(port)},
                        serve_log);
  };
  const std::string url_a = "http://127.0.0.1:" + std::to_string(port_a),
                    url_b = "http://127.0.0.1:" + std::to_string(port_b);
  Child a = serve(port_a), b = serve(port_b);
  // Both replicas in one comma-separated --server; the job starts while they load.
  Child g = Child::spawn({STRATA_BINARY,
                          "generate",
                          "--server",
                          url_a + "," + url_b,
                          "--input",
                          "define=" + input,
                          "--output",
                          output,
                          "--max-new-tokens",
                          "4",
                          "--temperature",
                          "0",
                          "--concurrency",
                          "8",
                          "--retry-initial-delay",
                          "0.05",
                          "--retry-max-delay",
                          "0.5",
                          "--server-down-timeout",
                          "60",
                          "--progress-interval",
                          "0.2"},
                         log);
  ASSERT_FALSE(wait_for_text(g, dir.string(), log, "replicas 2/2 up").has_value())
      << "generator exited early:\n"
      << read_file(log);
  ASSERT_FALSE(wait_for_lines(g, dir.string(), output, 30).has_value()) << read_file(log);
  a.kill9();  // with requests in flight on it: least-outstanding keeps both replicas busy
  const int64_t at_kill = count_lines(output);
  auto rc = g.wait_for(kWaitMs);
  ASSERT_EQ(rc.value_or(-1), 0) << read_file(log);
  EXPECT_LT(at_kill, kPrompts) << "the replica was killed after the job ended";
  const std::string text = read_file(log);
  EXPECT_NE(text.find("replica " + url_a + " is down"), std::string::npos) << text;
  EXPECT_NE(text.find("replicas 1/2 up"), std::string::npos) << text;
  EXPECT_EQ(text.find("gave up"), std::string::npos) << text;

  std::map<std::string, int> seen;
  std::ifstream in(output);
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    ++seen[j["id"]];
    EXPECT_EQ(j["conversations"].back()["role"], "assistant");
  }
  EXPECT_EQ(int(seen.size()), kPrompts);
  for (const auto& [id, n] : seen) EXPECT_EQ(n, 1) << id;
  EXPECT_EQ(count_lines(output), kPrompts);
  EXPECT_EQ(count_lines(output + ".failures.jsonl"), 0);
  EXPECT_TRUE(std::filesystem::exists(output + ".done"));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace strata
