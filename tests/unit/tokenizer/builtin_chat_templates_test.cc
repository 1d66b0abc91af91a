// --chat-template (ChatTemplate::from_argument): the built-in names render their formats exactly,
// a file (Jinja, or JSON with "chat_template") replaces the checkpoint's template and still gets
// the tokenizer's special tokens, and an unknown name is an error that lists the known ones.
#include "tokenizer/builtin_chat_templates.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "tokenizer/chat_template.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

const nlohmann::json kConversation = nlohmann::json::parse(
    R"([{"role":"system","content":"Be brief."},{"role":"user","content":" Hi \n"},{"role":"assistant","content":"Hello."}])");

// A tokenizer directory holding only tokenizer_config.json with `bos`.
fs::path tokenizer_dir(const std::string& name, const std::string& bos) {
  const fs::path dir =
      fs::temp_directory_path() / ("strata_builtin_tmpl_" + std::to_string(::getpid()) + name);
  fs::create_directories(dir);
  std::ofstream(dir / "tokenizer_config.json") << nlohmann::json{{"bos_token", bos}}.dump();
  return dir;
}

TEST(BuiltinChatTemplates, ChatMl) {
  auto t = ChatTemplate::from_argument("chatml", "/nonexistent");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  auto text = t->render(kConversation, true);
  ASSERT_TRUE(text.ok()) << text.status().to_string();
  EXPECT_EQ(*text,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n Hi \n<|im_end|>\n"
            "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(*t->render(kConversation, false),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n Hi \n<|im_end|>\n"
            "<|im_start|>assistant\nHello.<|im_end|>\n");
}

TEST(BuiltinChatTemplates, Llama3InstructTakesBosFromTheTokenizer) {
  const fs::path dir = tokenizer_dir("llama3", "<|begin_of_text|>");
  auto t = ChatTemplate::from_argument("llama-3-instruct", dir.string());
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(*t->render(kConversation, true),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  auto no_bos = ChatTemplate::from_argument("llama-3-instruct", "/nonexistent");
  ASSERT_TRUE(no_bos.ok());
  EXPECT_EQ(no_bos->render(kConversation, false)->rfind("<|start_header_id|>system", 0), 0u);
  fs::remove_all(dir);
}

TEST(BuiltinChatTemplates, FilesReplaceTheTemplate) {
  const fs::path dir = tokenizer_dir("files", "<s>");
  const fs::path jinja = dir / "mine.jinja", json = dir / "mine.json";
  std::ofstream(jinja)
      << "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}";
  std::ofstream(json) << nlohmann::json{{"chat_template",
                                         "{% for m in messages %}{{ m.role[0] }}{% endfor %}"}}
                             .dump();
  auto a = ChatTemplate::from_argument(jinja.string(), dir.string());
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_EQ(*a->render(kConversation, true), "<s>[system]Be brief.[user] Hi \n[assistant]Hello.");
  auto b = ChatTemplate::from_argument(json.string(), dir.string());
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  EXPECT_EQ(*b->render(kConversation, true), "sua");
  std::ofstream(dir / "broken.jinja") << "{% for m in messages %}";
  auto broken = ChatTemplate::from_argument((dir / "broken.jinja").string(), dir.string());
  ASSERT_FALSE(broken.ok());
  EXPECT_NE(broken.status().message().find("broken.jinja"), std::string::npos)
      << broken.status().to_string();
  fs::remove_all(dir);
}

TEST(BuiltinChatTemplates, UnknownNameListsTheKnownOnes) {
  auto t = ChatTemplate::from_argument("no-such-template", "/nonexistent");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kNotFound);
  for (std::string_view name : builtin_chat_template_names())
    EXPECT_NE(t.status().message().find(name), std::string::npos) << t.status().to_string();
}

}  // namespace
}  // namespace strata
