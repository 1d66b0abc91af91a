// --reasoning-parser through the real server. house-llama never writes a think tag, so the
// reasoning is opened by the prompt: a chat template whose generation prompt ends with "<think>"
// (as DeepSeek-V3.1's does with thinking on). The greedy output then is all reasoning, and equals
// the raw completion of the same text; streamed deltas carry it as reasoning_content; a request
// with separate_reasoning false, or a prompt that opens nothing, gets it all as content;
// `strata generate` keeps it in its records (from the server's reply, or split by its own
// --reasoning-parser on the in-process engine). The
// splitting itself (tags across chunks, tool sections) is tests/unit/server/reasoning_parser_test.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "server_process.h"

namespace strata::e2e {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const char* kQuestion = "What does the word harbor mean?";

json chat_body(bool stream = false) {
  return {{"messages", {{{"role", "user"}, {"content", kQuestion}}}},
          {"max_tokens", 12},
          {"temperature", 0},
          {"stream", stream}};
}

TEST(ServeReasoningParserTest, ThePromptOpensTheReasoningAndItComesBackApart) {
  const fs::path dir =
      fs::temp_directory_path() / ("strata_reasoning_parser_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "think.jinja")
      << "{% for m in messages %}{{ m['content'] }}{% endfor %}{% if add_generation_prompt "
         "%}<think>\n{% endif %}";
  ServerProcess server;
  ASSERT_TRUE(server.start(
      {"--chat-template", (dir / "think.jinja").string(), "--reasoning-parser", "deepseek-v3"}))
      << server.log();
  const int port = server.port();
  const json raw = post_json(
      port, "/v1/completions",
      {{"prompt", std::string(kQuestion) + "<think>\n"}, {"max_tokens", 12}, {"temperature", 0}});
  const std::string thought = raw["choices"][0]["text"];
  ASSERT_FALSE(thought.empty());
  ASSERT_EQ(thought.find("</think>"), std::string::npos) << "the test needs output without it";

  const json whole = post_json(port, "/v1/chat/completions", chat_body());
  EXPECT_EQ(whole["choices"][0]["message"]["reasoning_content"], thought) << whole;
  EXPECT_EQ(whole["choices"][0]["message"]["content"], "") << whole;

  json apart = chat_body();
  apart["separate_reasoning"] = false;
  const json together = post_json(port, "/v1/chat/completions", apart);
  EXPECT_EQ(together["choices"][0]["message"]["content"], thought) << together;
  EXPECT_FALSE(together["choices"][0]["message"].contains("reasoning_content")) << together;

  for (bool stream_reasoning : {true, false}) {
    json body = chat_body(/*stream=*/true);
    body["stream_reasoning"] = stream_reasoning;
    const HttpResponse r = http(port, "POST", "/v1/chat/completions", body.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    std::string reasoning, content;
    int reasoning_deltas = 0;
    for (const std::string& data : sse_data(r.body)) {
      if (data == "[DONE]") continue;
      const json delta = json::parse(data)["choices"][0]["delta"];
      if (delta.contains("reasoning_content")) {
        reasoning += delta["reasoning_content"].get<std::string>();
        ++reasoning_deltas;
      }
      if (delta.contains("content")) content += delta["content"].get<std::string>();
    }
    EXPECT_EQ(reasoning, thought) << r.body;
    EXPECT_EQ(content, "") << r.body;
    // Streamed: a delta per token or so; held: one, at the end (the reasoning never closed).
    if (stream_reasoning)
      EXPECT_GT(reasoning_deltas, 1) << r.body;
    else
      EXPECT_EQ(reasoning_deltas, 1) << r.body;
  }
  // `strata generate --server` keeps the reasoning in its records, as the assistant message's
  // reasoning_content (what thinking models' chat templates render it from).
  std::ofstream(dir / "in.jsonl")
      << json({{"id", "q"}, {"messages", {{{"role", "user"}, {"content", kQuestion}}}}}).dump()
      << "\n";
  std::string gen_out;
  ASSERT_EQ(run_command(std::string(STRATA_BINARY) +
                            " generate --server http://127.0.0.1:" + std::to_string(port) +
                            " --input q=" + (dir / "in.jsonl").string() + " --output " +
                            (dir / "out.jsonl").string() + " --max-new-tokens 12 --temperature 0",
                        &gen_out),
            0)
      << gen_out;
  std::ifstream records(dir / "out.jsonl");
  std::string line;
  ASSERT_TRUE(std::getline(records, line)) << gen_out;
  const json answer_message = json::parse(line)["messages"].back();
  EXPECT_EQ(answer_message["reasoning_content"], thought) << line;
  EXPECT_EQ(answer_message["content"], "") << line;
  EXPECT_EQ(server.stop(), 0) << server.log();

  // The in-process engine with the same parser writes the same record; with --server the flag is
  // refused (the server splits).
  const std::string local_gen =
      std::string(STRATA_BINARY) + " generate --model-path " + house_llama() + " --chat-template " +
      (dir / "think.jinja").string() +
      " --reasoning-parser deepseek-v3 --input q=" + (dir / "in.jsonl").string() +
      " --max-new-tokens 12 --temperature 0";
  ASSERT_EQ(run_command(local_gen + " --output " + (dir / "local.jsonl").string(), &gen_out), 0)
      << gen_out;
  std::ifstream local_records(dir / "local.jsonl");
  ASSERT_TRUE(std::getline(local_records, line)) << gen_out;
  EXPECT_EQ(json::parse(line)["messages"].back(), answer_message) << line;
  EXPECT_EQ(json::parse(line)["meta"]["sampling"]["reasoning_parser"], "deepseek-v3") << line;
  EXPECT_EQ(run_command(local_gen + " --server http://127.0.0.1:1 --output " +
                            (dir / "refused.jsonl").string(),
                        &gen_out),
            1)
      << gen_out;
  EXPECT_NE(gen_out.find("--reasoning-parser applies to the in-process engine"), std::string::npos)
      << gen_out;

  // house-llama's own template opens nothing: the answer is content, reasoning_content null.
  ServerProcess plain;
  ASSERT_TRUE(plain.start({"--reasoning-parser", "qwen3"})) << plain.log();
  const json answer = post_json(plain.port(), "/v1/chat/completions", chat_body());
  EXPECT_FALSE(answer["choices"][0]["message"]["content"].get<std::string>().empty()) << answer;
  EXPECT_TRUE(answer["choices"][0]["message"]["reasoning_content"].is_null()) << answer;
  EXPECT_EQ(plain.stop(), 0) << plain.log();

  std::string out;
  EXPECT_EQ(run_command(std::string(STRATA_BINARY) + " serve --port 0 --model-path " +
                            house_llama() + " --reasoning-parser nope",
                        &out),
            1)
      << out;
  EXPECT_NE(out.find("unknown parser 'nope'"), std::string::npos) << out;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace strata::e2e
