// A checkpoint that ships tiktoken.model instead of tokenizer.json (Kimi K2 / K2.5, Moonlight):
// strata converts it (tokenizer/tiktoken_model.h) and must encode exactly as tiktoken itself does.
// The vocabulary is house-llama's (8,189 byte-level tokens written in tiktoken's format, ranks in
// id order, and three that cross a letter/Han boundary), the pattern and the special-token layout
// Kimi's (tokenization_kimi.py); the reference is OpenAI's tiktoken (npm, its Rust core) with the
// same file, pattern and special tokens (tests/e2e/js/tiktoken_reference.mjs). Cases stress the
// pattern: Han runs against letters (Kimi's class intersection, which PCRE2 spells with a
// lookahead), contractions, digit groups, white space runs, punctuation, emoji, special tokens
// inside text.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "../server/server_process.h"
#include "support/temp_dir.h"
#include "support/tiktoken_file.h"
#include "tokenizer/tiktoken_model.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace strata::e2e {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// house-llama's vocabulary as a Kimi-style checkpoint: returns the number of base tokens.
int write_kimi_style_tokenizer(const testing::TempDir& dir) {
  std::stringstream ss;
  ss << std::ifstream(house_llama() + "/tokenizer.json").rdbuf();
  const json tok = json::parse(ss.str());
  std::vector<std::string> by_id(tok["model"]["vocab"].size());
  for (const auto& [s, id] : tok["model"]["vocab"].items()) by_id[id.get<size_t>()] = s;
  std::vector<std::string> tokens;
  for (size_t id = 3; id < by_id.size(); ++id) {  // 0..2 are house-llama's special tokens
    std::string bytes;
    size_t pos = 0;
    while (pos < by_id[id].size())
      bytes += char(tok::unicode_to_byte(tok::next_code_point(by_id[id], &pos)));
    tokens.push_back(std::move(bytes));
  }
  // Tokens across a letter/Han boundary ("h" and the bytes of 混), which only a pattern that
  // splits Han runs off the letters (Kimi's) keeps from forming in "English混合".
  const std::string boundary = "h\u6df7";
  for (size_t n = 2; n <= boundary.size(); ++n) tokens.push_back(boundary.substr(0, n));
  testing::write_tiktoken_model(dir.file("tiktoken.model"), tokens);
  const int rank = int(tokens.size());
  json config = {
      {"tokenizer_class", "TikTokenTokenizer"},
      {"auto_map", {{"AutoTokenizer", {"tokenization_kimi.TikTokenTokenizer", nullptr}}}},
      {"bos_token", "[BOS]"},
      {"eos_token", "[EOS]"},
      {"added_tokens_decoder",
       {{std::to_string(rank), {{"content", "[BOS]"}, {"special", true}}},
        {std::to_string(rank + 1), {{"content", "[EOS]"}, {"special", true}}},
        {std::to_string(rank + 2), {{"content", "<|im_end|>"}, {"special", true}}},
        {std::to_string(rank + 9),
         {{"content", "<|tool_calls_section_begin|>"}, {"special", true}}}}}};
  dir.write("tokenizer_config.json", config.dump());
  return rank;
}

TEST(TiktokenModel, EncodesAsTiktokenDoes) {
  const testing::TempDir dir("strata_tiktoken");
  const int base = write_kimi_style_tokenizer(dir);
  ASSERT_TRUE(has_tiktoken_model(dir.str()));
  auto tok = Tokenizer::load(dir.str());
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  EXPECT_EQ(tok->vocab_size(), base + 256);
  EXPECT_EQ(tok->token_to_id("<|im_end|>"), base + 2);
  EXPECT_EQ(tok->token_to_id("<|reserved_token_" + std::to_string(base + 3) + "|>"), base + 3);

  const std::vector<std::string> cases = {
      "Hello, world!",
      "The quick brown fox jumps over the lazy dog.",
      "I'll say don't, can't, WE'RE, and they've.",
      "In 2024 there were 123456 events, or 3.14159 pi.",
      "Hi, world!\n\nNext paragraph.\tTabbed.  \n",
      "end   ",
      "a  b\n\n\nc \r\n d",
      "café naïve résumé Zürich ÅNGSTRÖM",
      "你好世界，欢迎使用Kimi Linear！",
      "中文English混合 汉字abc 北京市 Pascal",
      "Englishh混合 th混",
      "こんにちは、世界 한국어",
      "🎉🚀 emoji test 😀",
      "def foo(x: int) -> bool:\n    return x > 0  # comment",
      "<|im_end|> inside[BOS]text<|tool_calls_section_begin|>",
      "x",
      " ",
  };
  json special = json::object();
  for (const char* name : {"[BOS]", "[EOS]", "<|im_end|>", "<|tool_calls_section_begin|>"})
    special[name] = *tok->token_to_id(name);
  const json input = {{"model", dir.file("tiktoken.model")},
                      {"special_tokens", special},
                      {"pattern", kKimiPatternTiktoken},
                      {"cases", cases}};
  dir.write("input.json", input.dump());
  std::string out;
  const fs::path js = fs::path(STRATA_SOURCE_DIR) / "tests" / "e2e" / "js";
  ASSERT_TRUE(fs::exists(js / "node_modules" / "tiktoken" / "package.json"))
      << "the tiktoken npm package is missing: run `npm ci` in " << js
      << " (scripts/setup.sh does it)";
  ASSERT_EQ(run_command("node '" + (js / "tiktoken_reference.mjs").string() + "' '" +
                            dir.file("input.json") + "'",
                        &out),
            0)
      << out;
  const json reference = json::parse(out);
  ASSERT_EQ(reference.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::vector<int32_t> ids = tok->encode(cases[i], /*allow_special=*/true);
    EXPECT_EQ(json(ids), reference[i]) << "case " << i << ": " << cases[i];
    EXPECT_EQ(tok->decode(ids, /*skip_special=*/false), cases[i]) << "case " << i;
  }
}

}  // namespace
}  // namespace strata::e2e
