// The house model's ChatML template must render the Hugging Face fixtures byte for byte, and
// ChatTemplate::load must find templates wherever HF checkpoints keep them.
#include "tokenizer/chat_template.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "support/temp_dir.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
const std::string kShared = STRATA_SHARED_DIR;

nlohmann::ordered_json read_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  return nlohmann::ordered_json::parse(in);
}

TEST(ChatTemplateFixture, HouseLlamaMatchesHuggingFace) {
  StatusOr<ChatTemplate> t = ChatTemplate::load(kShared + "/models/house-llama");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  nlohmann::ordered_json cases =
      read_json(kShared + "/fixtures/tokenizer_cases.json")["chat_template"];
  ASSERT_EQ(cases.size(), 3u);
  for (const auto& c : cases) {
    StatusOr<std::string> out = t->render(c["messages"], c["add_generation_prompt"].get<bool>());
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    EXPECT_EQ(*out, c["rendered"].get<std::string>());
    // The unordered json overload renders the same (ChatML prints no objects).
    nlohmann::json plain = nlohmann::json::parse(c["messages"].dump());
    StatusOr<std::string> out2 = t->render(plain, c["add_generation_prompt"].get<bool>());
    ASSERT_TRUE(out2.ok());
    EXPECT_EQ(*out2, *out);
  }
}

TEST(ChatTemplateFixture, HouseLlamaSpecialTokensFromConfig) {
  StatusOr<ChatTemplate> t = ChatTemplate::load(kShared + "/models/house-llama");
  ASSERT_TRUE(t.ok());
  const jinja::Value* eos = t->default_context().find("eos_token");
  ASSERT_NE(eos, nullptr);
  EXPECT_EQ(eos->str(), "<|endoftext|>");
  EXPECT_EQ(t->default_context().find("bos_token"), nullptr);  // the config sets none
}

using strata::testing::TempDir;

TEST(ChatTemplateLoad, TokenizerConfigStringAndSpecialTokenObjects) {
  TempDir dir;
  dir.write("tokenizer_config.json", R"({
    "bos_token": {"content": "<s>", "lstrip": false},
    "eos_token": "</s>",
    "unk_token": null,
    "chat_template": "{{ bos_token }}{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}"
  })");
  StatusOr<ChatTemplate> t = ChatTemplate::load(dir.str());
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  StatusOr<std::string> out =
      t->render(nlohmann::json::parse(R"([{"role":"user","content":"hi"}])"), false);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(*out, "<s>hi</s>");
  // extra_context overrides the configured tokens.
  out = t->render(nlohmann::json::parse(R"([{"role":"user","content":"hi"}])"), false,
                  nlohmann::json{{"bos_token", "[B]"}});
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(*out, "[B]hi</s>");
}

TEST(ChatTemplateLoad, NamedTemplateListTakesDefault) {
  TempDir dir;
  dir.write("tokenizer_config.json", R"({"chat_template": [
    {"name": "tool_use", "template": "tools"},
    {"name": "default", "template": "default:{{ messages | length }}"}]})");
  StatusOr<ChatTemplate> t = ChatTemplate::load(dir.str());
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  StatusOr<std::string> out =
      t->render(nlohmann::json::array({{{"role", "user"}, {"content", "x"}}}), false);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(*out, "default:1");

  TempDir no_default;
  no_default.write("tokenizer_config.json",
                   R"({"chat_template": [{"name": "rag", "template": "x"}]})");
  StatusOr<ChatTemplate> bad = ChatTemplate::load(no_default.str());
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("rag"), std::string::npos);
}

TEST(ChatTemplateLoad, JinjaFileWinsOverConfig) {
  TempDir dir;
  dir.write("tokenizer_config.json", R"({"chat_template": "from config"})");
  dir.write("chat_template.jinja", "from jinja file\n");
  StatusOr<ChatTemplate> t = ChatTemplate::load(dir.str());
  ASSERT_TRUE(t.ok());
  StatusOr<std::string> out = t->render(nlohmann::json::array(), false);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(*out, "from jinja file");  // Jinja drops one trailing newline
}

TEST(ChatTemplateLoad, ChatTemplateJson) {
  TempDir dir;
  dir.write("chat_template.json", R"({"chat_template": "processor template"})");
  StatusOr<ChatTemplate> t = ChatTemplate::load(dir.str());
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(t->source(), "processor template");
}

TEST(ChatTemplateLoad, MissingTemplateIsNotFound) {
  TempDir dir;
  dir.write("tokenizer_config.json", R"({"eos_token": "</s>"})");
  StatusOr<ChatTemplate> t = ChatTemplate::load(dir.str());
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(ChatTemplate::load(dir.str() + "/nope").status().code(), StatusCode::kNotFound);
}

TEST(ChatTemplateLoad, BrokenConfigIsDataLoss) {
  TempDir dir;
  dir.write("tokenizer_config.json", "{\"chat_template\": ");
  EXPECT_EQ(ChatTemplate::load(dir.str()).status().code(), StatusCode::kDataLoss);
}

TEST(ChatTemplateLoad, SyntaxErrorNamesDirAndLine) {
  TempDir dir;
  dir.write("chat_template.jinja", "ok\n{% if x %}\nno end");
  StatusOr<ChatTemplate> t = ChatTemplate::load(dir.str());
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find(dir.str()), std::string::npos) << t.status().message();
  EXPECT_NE(t.status().message().find("endif"), std::string::npos) << t.status().message();
}

}  // namespace
}  // namespace strata
