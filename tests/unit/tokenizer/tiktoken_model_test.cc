// The tiktoken.model conversion (tokenizer/tiktoken_model.h) on a vocabulary small enough to
// work out by hand with tiktoken's rule (merge the adjacent pair whose concatenation has the
// lowest rank), and the file errors. The comparison with OpenAI's tiktoken itself on a real-size
// vocabulary is tests/e2e/cli/tiktoken_test.cc.
#include "tokenizer/tiktoken_model.h"

#include <gtest/gtest.h>

#include "support/temp_dir.h"
#include "support/tiktoken_file.h"
#include "tokenizer/tokenizer.h"

namespace strata {
namespace {

// The 256 bytes (rank = byte), then "ab" 256, "abc" 257, "bc" 258, "cab" 259.
const char* kConfig =
    R"({"tokenizer_class": "TikTokenTokenizer",
        "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", null]},
        "added_tokens_decoder": {"261": {"content": "<|im_end|>", "special": true}}})";

// The vocabulary in `dir` (a TempDir), with `extra` lines after it.
void write_model(const testing::TempDir& dir, const std::string& extra = "") {
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.push_back(std::string(1, char(b)));
  for (const char* t : {"ab", "abc", "bc", "cab"}) tokens.push_back(t);
  testing::write_tiktoken_model(dir.file("tiktoken.model"), tokens, extra);
  dir.write("tokenizer_config.json", kConfig);
}

TEST(TiktokenModel, MergesAsTiktokenRanksThem) {
  const testing::TempDir dir("strata_tiktoken_unit");
  write_model(dir);
  auto tok = Tokenizer::load(dir.str());
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  EXPECT_EQ(tok->vocab_size(), 260 + 256);
  // "abc": ab (256) beats bc (258), then ab+c is abc (257).
  EXPECT_EQ(tok->encode("abc"), (std::vector<int32_t>{257}));
  // "xbc": only bc merges.
  EXPECT_EQ(tok->encode("xbc"), (std::vector<int32_t>{'x', 258}));
  // "cabc": ab (256) first; then c+ab is cab (259) and ab+c is abc (257): abc ranks lower.
  EXPECT_EQ(tok->encode("cabc"), (std::vector<int32_t>{'c', 257}));
  // Bytes of a multi-byte character stay bytes when no token joins them.
  EXPECT_EQ(tok->encode("\xc3\xa9"), (std::vector<int32_t>{0xc3, 0xa9}));
  EXPECT_EQ(tok->decode(tok->encode("cabc \xc3\xa9")), "cabc \xc3\xa9");
  // The specials after the vocabulary: named ones, the rest reserved by id.
  EXPECT_EQ(tok->token_to_id("<|im_end|>"), 261);
  EXPECT_EQ(tok->token_to_id("<|reserved_token_260|>"), 260);
  EXPECT_EQ(tok->encode("ab<|im_end|>", /*allow_special=*/true), (std::vector<int32_t>{256, 261}));
}

// A tokenizer class whose pattern strata does not know is refused, naming it.
TEST(TiktokenModel, UnknownTokenizerClassesAreRefused) {
  const testing::TempDir dir("strata_tiktoken_unit");
  write_model(dir);
  dir.write("tokenizer_config.json", R"({"tokenizer_class": "SomethingElse"})");
  auto tok = Tokenizer::load(dir.str());
  ASSERT_FALSE(tok.ok());
  EXPECT_NE(tok.status().message().find("pre-tokenization strata does not know"), std::string::npos)
      << tok.status().message();
}

TEST(TiktokenModel, MalformedFilesAreRefusedByLine) {
  struct Case {
    std::string extra;
    const char* message;
  };
  const Case cases[] = {
      {"YWJj\n", "line 261: expected \"BASE64 RANK\""},
      {"YWJj 7\n", "line 261: rank 7 or its token given twice"},
      {"eHl6 261\n", "no token has rank 260"},
      {"Y=Jj 260\n", "line 261: expected \"BASE64 RANK\""},
      {"eHl6 1000000000\n", "line 261: rank 1000000000 beyond the file's 262 lines"},
  };
  for (const Case& c : cases) {
    const testing::TempDir dir("strata_tiktoken_unit");
    write_model(dir, c.extra);
    auto tok = Tokenizer::load(dir.str());
    ASSERT_FALSE(tok.ok()) << c.extra;
    EXPECT_NE(tok.status().message().find(c.message), std::string::npos)
        << c.extra << " -> " << tok.status().message();
  }
}

}  // namespace
}  // namespace strata
