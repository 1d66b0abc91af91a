// The tiktoken.model conversion (tokenizer/tiktoken_model.h) on a vocabulary small enough to
// work out by hand with tiktoken's rule (merge the adjacent pair whose concatenation has the
// lowest rank), and the file errors. The comparison with OpenAI's tiktoken itself on a real-size
// vocabulary is tests/e2e/cli/tiktoken_test.cc.
#include "tokenizer/tiktoken_model.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "tokenizer/tokenizer.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

// The 256 bytes (rank = byte), then "ab" 256, "abc" 257, "bc" 258, "cab" 259.
const char* kConfig =
    R"({"tokenizer_class": "TikTokenTokenizer",
        "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", null]},
        "added_tokens_decoder": {"261": {"content": "<|im_end|>", "special": true}}})";

std::string base64(const std::string& bytes) {
  static const char* kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (size_t i = 0; i < bytes.size(); i += 3) {
    uint32_t n = uint32_t(uint8_t(bytes[i])) << 16;
    if (i + 1 < bytes.size()) n |= uint32_t(uint8_t(bytes[i + 1])) << 8;
    if (i + 2 < bytes.size()) n |= uint8_t(bytes[i + 2]);
    out += kAlphabet[n >> 18];
    out += kAlphabet[(n >> 12) & 63];
    out += i + 1 < bytes.size() ? kAlphabet[(n >> 6) & 63] : '=';
    out += i + 2 < bytes.size() ? kAlphabet[n & 63] : '=';
  }
  return out;
}

fs::path write_model(const std::string& extra_lines = "") {
  const fs::path dir =
      fs::temp_directory_path() / ("strata_tiktoken_unit_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream model(dir / "tiktoken.model");
  for (int b = 0; b < 256; ++b) model << base64(std::string(1, char(b))) << " " << b << "\n";
  int rank = 256;
  for (const char* t : {"ab", "abc", "bc", "cab"}) model << base64(t) << " " << rank++ << "\n";
  model << extra_lines;
  std::ofstream(dir / "tokenizer_config.json") << kConfig;
  return dir;
}

TEST(TiktokenModel, MergesAsTiktokenRanksThem) {
  const fs::path dir = write_model();
  auto tok = Tokenizer::load(dir.string());
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
  fs::remove_all(dir);
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
    const fs::path dir = write_model(c.extra);
    auto tok = Tokenizer::load(dir.string());
    ASSERT_FALSE(tok.ok()) << c.extra;
    EXPECT_NE(tok.status().message().find(c.message), std::string::npos)
        << c.extra << " -> " << tok.status().message();
    fs::remove_all(dir);
  }
}

}  // namespace
}  // namespace strata
