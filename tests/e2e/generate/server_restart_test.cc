// `strata generate --server` against an OpenAI-compatible server that crashes mid-run, comes
// back answering 503 while "loading", throws transient 500s, and rejects one prompt with a 400.
// The server is a small fake written here with cpp-httplib and run in a forked child that the
// test kills and restarts (`strata serve` was not ready when this was written; the generator
// speaks plain OpenAI, so the fake exercises the same client paths).
#include <gtest/gtest.h>

#if __has_include(<httplib.h>)
#include <httplib.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>

#include "pipeline/dataset.h"
#include "pipeline/output_log.h"
#include "support/child_process.h"

namespace strata {
namespace {

using testing_support::Child;
using testing_support::free_port;
constexpr int kWaitMs = 90000;  // a hung generator fails the test instead of hanging it

struct Life {
  int die_after = -1;         // crash (exit, connections reset) on this request number
  int unavailable_first = 0;  // answer 503 to the first requests ("loading")
};

// The fake server: echoes the last user message and the seed it was asked for.
void serve(int port, Life life) {
  httplib::Server srv;
  std::mutex mu;
  int requests = 0;
  srv.Get("/v1/models", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(R"({"object":"list","data":[{"id":"fake-model","object":"model"}]})",
                    "application/json");
  });
  srv.Post("/v1/chat/completions", [&](const httplib::Request& req, httplib::Response& res) {
    int n;
    {
      std::lock_guard<std::mutex> lk(mu);
      n = ++requests;
    }
    if (n == life.die_after) ::_exit(1);  // a crash with requests in flight
    if (n <= life.unavailable_first) {
      res.status = 503;
      res.set_content(R"({"error":{"message":"loading"}})", "application/json");
      return;
    }
    if (n % 7 == 0) {
      res.status = 500;
      res.set_content(R"({"error":{"message":"transient"}})", "application/json");
      return;
    }
    auto body = nlohmann::json::parse(req.body);
    const std::string content = body["messages"].back()["content"];
    if (content.find("TOO LONG") != std::string::npos) {
      res.status = 400;
      res.set_content(
          R"({"error":{"message":"prompt is too long","type":"invalid_request_error"}})",
          "application/json");
      return;
    }
    nlohmann::json reply = {
        {"choices",
         {{{"index", 0},
           {"message",
            {{"role", "assistant"},
             {"content", "echo " + content + " seed " + body["seed"].dump()}}},
           {"finish_reason", "length"}}}},
        {"usage", {{"prompt_tokens", 3}, {"completion_tokens", body["max_tokens"]}}}};
    res.set_content(reply.dump(), "application/json");
  });
  srv.listen("127.0.0.1", port);
}

TEST(GenerateServerRestart, CrashesRestartsAndOutagesLoseNothing) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("strata_server_restart_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string input = (dir / "in.jsonl").string(), output = (dir / "out.jsonl").string(),
                    log = (dir / "log.txt").string();
  constexpr int kPrompts = 150;
  {
    std::ofstream out(input);
    for (int i = 0; i < kPrompts; ++i) {
      const std::string content =
          i == 42 ? "TOO LONG " + std::to_string(i) : "q" + std::to_string(i);
      out << nlohmann::json({{"id", "s" + std::to_string(i)},
                             {"messages", {{{"role", "user"}, {"content", content}}}}})
                 .dump()
          << "\n";
    }
  }
  const int port = free_port();
  const std::vector<std::string> cmd = {STRATA_BINARY,
                                        "generate",
                                        "--server",
                                        "http://127.0.0.1:" + std::to_string(port) + "/v1",
                                        "--input",
                                        "s=" + input,
                                        "--output",
                                        output,
                                        "--concurrency",
                                        "6",
                                        "--seed",
                                        "7",
                                        "--max-new-tokens",
                                        "9",
                                        "--retry-initial-delay",
                                        "0.02",
                                        "--retry-max-delay",
                                        "0.1",
                                        "--server-down-timeout",
                                        "1.5",
                                        "--max-attempts",
                                        "8"};

  // Life 1 crashes at its 40th request; life 2 comes back "loading" (503s) and crashes at its
  // 60th; then the server stays down until the generator gives up (exit 3, work saved).
  Child server = Child::fork_fn([&] { serve(port, {.die_after = 40}); });
  Child gen = Child::spawn(cmd, log);
  ASSERT_EQ(server.wait_for(kWaitMs).value_or(-1), 1) << "the server did not crash as planned";
  server = Child::fork_fn([&] { serve(port, {.die_after = 60, .unavailable_first = 8}); });
  ASSERT_EQ(server.wait_for(kWaitMs).value_or(-1), 1) << "the server did not crash as planned";
  auto rc = gen.wait_for(kWaitMs);
  std::ifstream lf(log);
  const std::string log_text((std::istreambuf_iterator<char>(lf)), {});
  ASSERT_EQ(rc.value_or(-1), 3) << log_text;
  auto partial = scan_output(output);
  ASSERT_TRUE(partial.ok());
  EXPECT_GT(partial->records, 40);
  EXPECT_LT(partial->records, kPrompts);
  EXPECT_TRUE(partial->duplicates.empty());

  // Life 3 stays up; the same command resumes and finishes. Exit 1: one prompt failed (400).
  server = Child::fork_fn([&] { serve(port, {}); });
  Child again = Child::spawn(cmd, log);
  rc = again.wait_for(kWaitMs);
  std::ifstream lf2(log);
  ASSERT_EQ(rc.value_or(-1), 1) << std::string((std::istreambuf_iterator<char>(lf2)), {});

  std::map<std::string, int> count;
  std::ifstream in(output);
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    const std::string id = j["id"];
    ++count[id];
    const int i = std::stoi(id.substr(1));
    EXPECT_EQ(j["messages"].back()["content"],
              "echo q" + std::to_string(i) + " seed " + std::to_string(prompt_seed(7, id)));
    EXPECT_EQ(j["meta"]["model"], "fake-model");
    EXPECT_EQ(j["meta"]["completion_tokens"], 9);
  }
  EXPECT_EQ(int(count.size()), kPrompts - 1);
  for (const auto& [id, n] : count) EXPECT_EQ(n, 1) << id;
  EXPECT_EQ(count.count("s42"), 0u);
  std::ifstream fin(output + ".failures.jsonl");
  ASSERT_TRUE(std::getline(fin, line));
  auto f = nlohmann::json::parse(line);
  EXPECT_EQ(f["id"], "s42");
  EXPECT_EQ(f["http_status"], 400);
  EXPECT_NE(f["error"].get<std::string>().find("prompt is too long"), std::string::npos);
  EXPECT_FALSE(std::getline(fin, line)) << "only the 400 failed; transient errors were retried";
  EXPECT_TRUE(std::filesystem::exists(output + ".done"));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace strata

#else
TEST(GenerateServerRestart, NeedsCppHttplib) { GTEST_SKIP() << "cpp-httplib is not installed"; }
#endif
