// SGLang flags that used to be refused, through the real server: --chat-template (a built-in
// name, a file), --tokenizer-path (a model directory without tokenizer files) and
// --disable-radix-cache each change what they should and leave greedy outputs as they were; the
// multi-node flags start (one node) or refuse what cannot run here, saying why.
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

std::string chat(int port, const std::string& question) {
  const json j = post_json(port, "/v1/chat/completions",
                           {{"messages", {{{"role", "user"}, {"content", question}}}},
                            {"max_tokens", 12},
                            {"temperature", 0}});
  return j.is_object() ? j["choices"][0]["message"]["content"].get<std::string>() : "";
}

std::string complete(int port, const std::string& prompt) {
  const json j = post_json(port, "/v1/completions",
                           {{"prompt", prompt}, {"max_tokens", 12}, {"temperature", 0}});
  return j.is_object() ? j["choices"][0]["text"].get<std::string>() : "";
}

fs::path temp_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() /
                     ("strata_sglang_flags_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

TEST(ServeSglangFlagsTest, ChatTemplateByNameAndFromAFile) {
  ServerProcess plain;
  ASSERT_TRUE(plain.start({})) << plain.log();
  const std::string expected_chat = chat(plain.port(), kQuestion);
  const std::string expected_raw = complete(plain.port(), kQuestion);
  ASSERT_FALSE(expected_chat.empty());
  EXPECT_EQ(plain.stop(), 0);

  // house-llama's own template is ChatML: the built-in name gives the same prompt.
  ServerProcess named;
  ASSERT_TRUE(named.start({"--chat-template", "chatml"})) << named.log();
  EXPECT_EQ(chat(named.port(), kQuestion), expected_chat);
  EXPECT_EQ(named.stop(), 0);

  // A template that writes the bare content: chat now equals the raw completion of that text.
  const fs::path dir = temp_dir("template");
  std::ofstream(dir / "bare.jinja") << "{% for m in messages %}{{ m['content'] }}{% endfor %}";
  ServerProcess file;
  ASSERT_TRUE(file.start({"--chat-template", (dir / "bare.jinja").string()})) << file.log();
  EXPECT_EQ(chat(file.port(), kQuestion), expected_raw);
  EXPECT_EQ(file.stop(), 0);

  std::string out;
  EXPECT_EQ(run_command(std::string(STRATA_BINARY) + " serve --port 0 --model-path " +
                            house_llama() + " --chat-template no-such-template",
                        &out),
            1)
      << out;
  EXPECT_NE(out.find("neither a file nor a built-in template name (chatml"), std::string::npos)
      << out;
  fs::remove_all(dir);
}

// chat_template_kwargs become template variables and a message's reasoning_content reaches the
// template (SGLang's request fields): with a template that writes them, the chat prompt is the
// raw text they spell, so its completion equals that text's.
TEST(ServeSglangFlagsTest, ChatTemplateKwargsAndReasoningContentReachTheTemplate) {
  const fs::path dir = temp_dir("kwargs");
  std::ofstream(dir / "vars.jinja")
      << "{% if prefix is defined %}{{ prefix }}{% endif %}{% for m in messages %}"
         "{% if m.reasoning_content is defined %}{{ m.reasoning_content }}{% endif %}"
         "{{ m['content'] }}{% endfor %}";
  ServerProcess server;
  ASSERT_TRUE(server.start({"--chat-template", (dir / "vars.jinja").string()})) << server.log();
  const std::string expected = complete(server.port(), kQuestion);
  ASSERT_FALSE(expected.empty());
  json j = post_json(server.port(), "/v1/chat/completions",
                     {{"messages", {{{"role", "user"}, {"content", " word harbor mean?"}}}},
                      {"chat_template_kwargs", {{"prefix", "What does the"}}},
                      {"max_tokens", 12},
                      {"temperature", 0}});
  EXPECT_EQ(j["choices"][0]["message"]["content"], expected) << j.dump();
  j = post_json(server.port(), "/v1/chat/completions",
                {{"messages",
                  {{{"role", "user"}, {"content", "What does"}},
                   {{"role", "assistant"},
                    {"content", " harbor mean?"},
                    {"reasoning_content", " the word"}}}},
                 {"max_tokens", 12},
                 {"temperature", 0}});
  EXPECT_EQ(j["choices"][0]["message"]["content"], expected) << j.dump();
  EXPECT_EQ(server.stop(), 0);
  fs::remove_all(dir);
}

// The model's weights and config without its tokenizer files: --tokenizer-path supplies them.
TEST(ServeSglangFlagsTest, TokenizerPath) {
  const fs::path dir = temp_dir("weights_only");
  for (const char* f : {"config.json", "generation_config.json", "model.safetensors"})
    fs::create_symlink(fs::path(house_llama()) / f, dir / f);
  std::string out;
  EXPECT_NE(run_command(std::string(STRATA_BINARY) + " serve --port 0 --model-path " + dir.string(),
                        &out),
            0);

  ServerProcess plain;
  ASSERT_TRUE(plain.start({})) << plain.log();
  const std::string expected = chat(plain.port(), kQuestion);
  EXPECT_EQ(plain.stop(), 0);
  ServerProcess split;
  split.set_model_path(dir.string());
  ASSERT_TRUE(
      split.start({"--tokenizer-path", house_llama(), "--served-model-name", "house-llama"}))
      << split.log();
  EXPECT_EQ(chat(split.port(), kQuestion), expected);
  EXPECT_EQ(split.stop(), 0);
  fs::remove_all(dir);
}

// The same prompt twice: the second is served from the prefix cache, unless it is disabled;
// the text is the same either way.
TEST(ServeSglangFlagsTest, DisableRadixCache) {
  const std::string prompt = "The harbor was quiet in the early morning, and the boats";
  for (const bool disable : {false, true}) {
    SCOPED_TRACE(disable ? "--disable-radix-cache" : "default");
    ServerProcess server;
    std::vector<std::string> args = {"--page-size", "4"};
    if (disable) args.push_back("--disable-radix-cache");
    ASSERT_TRUE(server.start(args)) << server.log();
    const json body = {{"prompt", prompt}, {"max_tokens", 8}, {"temperature", 0}};
    const json first = post_json(server.port(), "/v1/completions", body);
    const json second = post_json(server.port(), "/v1/completions", body);
    ASSERT_TRUE(first.is_object() && second.is_object());
    EXPECT_EQ(first["choices"][0]["text"], second["choices"][0]["text"]);
    const int cached = second["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>();
    if (disable) {
      EXPECT_EQ(cached, 0);
      const std::string metrics = http(server.port(), "GET", "/metrics").body;
      EXPECT_EQ(metric_value(metrics, "strata_kv_cache_prefix_cached_tokens"), 0) << metrics;
    } else {
      EXPECT_GT(cached, 0);
    }
    EXPECT_EQ(server.stop(), 0);
  }
}

// Several nodes need NCCL ranks (the launch itself: unit NodeLaunchTest/NodeSupervisorTest, and
// bench/cuda/multinode_check.sh on GPUs); one node is today's server.
TEST(ServeSglangFlagsTest, MultiNodeFlags) {
  const std::string base =
      std::string(STRATA_BINARY) + " serve --port 0 --model-path " + house_llama() + " ";
  const std::pair<std::string, std::string> refused[] = {
      {"--nnodes 2 --node-rank 0 --dist-init-addr 127.0.0.1:29500", "--device cuda"},
      {"--nnodes 2 --node-rank 2 --dist-init-addr 127.0.0.1:29500",
       "--node-rank 2 is not in [0, --nnodes 2)"},
      {"--device cuda --tp-size 2 --nnodes 2 --node-rank 1", "needs --dist-init-addr"},
      {"--device cuda --tp-size 2 --nnodes 2 --node-rank 1 --dist-init-addr node0",
       "expected HOST:PORT"},
      {"--device cuda --tp-size 3 --nnodes 2 --node-rank 1 --dist-init-addr node0:1",
       "does not split over"},
  };
  for (const auto& [flags, needle] : refused) {
    std::string out;
    EXPECT_EQ(run_command(base + flags, &out), 1) << flags << ": " << out;
    EXPECT_NE(out.find(needle), std::string::npos) << flags << ": " << out;
  }
  // Valid flags: a build without NCCL says so; one with NCCL starts the node's ranks, which
  // fail on a machine without GPUs, and the node exits non-zero with them.
  std::string out;
  EXPECT_NE(
      run_command(
          base +
              "--device cuda --tp-size 2 --nnodes 2 --node-rank 1 --dist-init-addr 127.0.0.1:29500",
          &out),
      0)
      << out;
  EXPECT_TRUE(out.find("need a build with NCCL") != std::string::npos ||
              out.find("rank") != std::string::npos)
      << out;
  ServerProcess one_node;
  ASSERT_TRUE(
      one_node.start({"--nnodes", "1", "--node-rank", "0", "--dist-init-addr", "127.0.0.1:29500"}))
      << one_node.log();
  EXPECT_EQ(chat(one_node.port(), kQuestion).empty(), false);
  EXPECT_EQ(one_node.stop(), 0);
  EXPECT_NE(one_node.log().find("--dist-init-addr is not needed"), std::string::npos)
      << one_node.log();
}

}  // namespace
}  // namespace strata::e2e
