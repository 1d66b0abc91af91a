// The house tokenizer (byte-level BPE, Split regex + ByteLevel) against the outputs of Hugging
// Face tokenizers 0.23 in ../shared/fixtures/tokenizer_cases.json.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>

#include "tokenizer/prompt_encoder.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace strata {
namespace {

const std::string kShared = STRATA_SHARED_DIR;

const Tokenizer& house() {
  static const Tokenizer* t = [] {
    auto r = Tokenizer::load(kShared + "/models/house-llama");
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    if (!r.ok()) std::abort();
    return new Tokenizer(std::move(r).value());
  }();
  return *t;
}

struct Case {
  std::string text;
  std::vector<int32_t> ids;
  std::string decoded;
};

std::vector<Case> load_cases() {
  std::ifstream in(kShared + "/fixtures/tokenizer_cases.json");
  EXPECT_TRUE(in.good());
  nlohmann::json j = nlohmann::json::parse(in);
  std::vector<Case> cases;
  for (const auto& c : j.at("cases")) {
    cases.push_back(Case{c.at("text").get<std::string>(), c.at("ids").get<std::vector<int32_t>>(),
                         c.at("decoded").get<std::string>()});
  }
  return cases;
}

std::string stream_all(const Tokenizer& t, std::span<const int32_t> ids, bool skip_special,
                       bool* all_valid) {
  StreamDecoder sd(t, skip_special);
  std::string out;
  *all_valid = true;
  for (int32_t id : ids) {
    const std::string piece = sd.push(id);
    *all_valid = *all_valid && tok::is_valid_utf8(piece);
    out += piece;
  }
  const std::string tail = sd.finish();
  *all_valid = *all_valid && tok::is_valid_utf8(tail);
  return out + tail;
}

TEST(HouseTokenizer, FixtureCasesEncodeDecodeStream) {
  const auto cases = load_cases();
  ASSERT_EQ(cases.size(), 39u);
  const Tokenizer& t = house();
  for (const Case& c : cases) {
    EXPECT_EQ(t.encode(c.text), c.ids) << "text: " << c.text;
    EXPECT_EQ(t.decode(c.ids), c.decoded) << "text: " << c.text;
    bool valid = false;
    EXPECT_EQ(stream_all(t, c.ids, /*skip_special=*/false, &valid), c.decoded) << c.text;
    EXPECT_TRUE(valid) << c.text;
  }
}

// ByteLevel's own GPT-2 regex (use_regex=true) splits these texts exactly as the house Split
// pattern does, so the Hugging Face ids must come out unchanged. (Newline runs differ: GPT-2's
// `\s+(?!\S)` leaves "\n\n" before a word as "\n" + "\n".)
TEST(HouseTokenizer, ByteLevelBuiltinRegexOnSameSplits) {
  std::ifstream in(kShared + "/models/house-llama/tokenizer.json");
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(ss.str());
  j["pre_tokenizer"] = {{"type", "ByteLevel"},
                        {"add_prefix_space", false},
                        {"trim_offsets", true},
                        {"use_regex", true}};
  auto r = Tokenizer::from_json_text(j.dump());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  int checked = 0;
  for (const Case& c : load_cases()) {
    if (c.text == "Hello world" || c.text == "   leading spaces" ||
        c.text == "The quick brown fox jumps over the lazy dog.") {
      EXPECT_EQ(r->encode(c.text), c.ids) << c.text;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 3);
}

TEST(HouseTokenizer, VocabAndSpecialTokens) {
  const Tokenizer& t = house();
  EXPECT_EQ(t.vocab_size(), 8192);
  EXPECT_EQ(t.token_to_id("<|im_start|>"), 1);
  EXPECT_EQ(t.token_to_id("<|endoftext|>"), 0);
  EXPECT_EQ(t.id_to_token(2), "<|im_end|>");
  EXPECT_TRUE(t.is_special(2));
  EXPECT_FALSE(t.is_special(42));
  EXPECT_EQ(t.eos_token(), "<|endoftext|>");
  EXPECT_EQ(t.eos_id(), 0);
  EXPECT_FALSE(t.bos_token().has_value());
  EXPECT_EQ(t.special_ids(), (std::vector<int32_t>{0, 1, 2}));
  EXPECT_FALSE(t.token_to_id("no such token").has_value());
  EXPECT_EQ(t.id_to_token(999999), "");
}

TEST(HouseTokenizer, SkipSpecialAndDisallowSpecial) {
  const Tokenizer& t = house();
  const std::vector<int32_t> ids = t.encode("<|im_start|>user\nhi<|im_end|>\n");
  EXPECT_EQ(t.decode(ids, /*skip_special=*/true), "user\nhi\n");
  // User text must not be able to inject control tokens.
  const std::vector<int32_t> plain = t.encode("<|im_start|>", /*allow_special=*/false);
  EXPECT_GT(plain.size(), 1u);
  for (int32_t id : plain) EXPECT_FALSE(t.is_special(id));
  EXPECT_EQ(t.decode(plain), "<|im_start|>");
  // The post-processor is ByteLevel: nothing is added.
  EXPECT_EQ(t.with_special_tokens(ids), ids);
}

TEST(HouseTokenizer, StreamSkipsSpecialAndHoldsPartialCharacters) {
  const Tokenizer& t = house();
  // "😀" is four byte tokens: nothing may come out before the last one.
  const std::vector<int32_t> ids = t.encode("a😀");
  ASSERT_GE(ids.size(), 2u);
  StreamDecoder sd(t);
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::string piece = sd.push(ids[i]);
    EXPECT_TRUE(tok::is_valid_utf8(piece));
    if (i + 1 < ids.size()) EXPECT_EQ(piece.find("\xF0"), std::string::npos);
    out += piece;
  }
  out += sd.finish();
  EXPECT_EQ(out, "a😀");

  // A truncated character at the end becomes U+FFFD at finish.
  StreamDecoder trunc(t);
  std::string text;
  for (size_t i = 0; i + 1 < ids.size(); ++i) text += trunc.push(ids[i]);
  const std::string tail = trunc.finish();
  EXPECT_EQ(text + tail, "a\xEF\xBF\xBD");

  StreamDecoder skip(t, /*skip_special=*/true);
  std::string s;
  for (int32_t id : t.encode("<|im_start|>hi<|im_end|>")) s += skip.push(id);
  s += skip.finish();
  EXPECT_EQ(s, "hi");
}

// Random code points from many scripts, whitespace kinds and emoji.
std::string random_text(std::mt19937& rng, size_t n_chars) {
  static const std::vector<std::pair<char32_t, char32_t>> ranges = {
      {0x20, 0x7E},     {0x20, 0x7E},     {0x20, 0x7E},       {0x09, 0x0D},     {0x80, 0x24F},
      {0x370, 0x3FF},   {0x400, 0x4FF},   {0x590, 0x6FF},     {0x2000, 0x206F}, {0x3000, 0x30FF},
      {0x4E00, 0x4FFF}, {0xAC00, 0xAD00}, {0x1F300, 0x1F64F}, {0xE000, 0xE010}, {0x10000, 0x10100}};
  std::string out;
  for (size_t i = 0; i < n_chars; ++i) {
    // Named members, not a structured binding: clang 14 (the sanitizer/fuzz build) cannot
    // capture one in the lambda below.
    const auto& range = ranges[rng() % ranges.size()];
    const char32_t lo = range.first, hi = range.second;
    out += [&] {
      std::string s;
      tok::append_utf8(lo + char32_t(rng() % (hi - lo + 1)), &s);
      return s;
    }();
  }
  return out;
}

TEST(HouseTokenizer, RandomTextRoundTrips) {
  const Tokenizer& t = house();
  std::mt19937 rng(1234);
  for (int iter = 0; iter < 300; ++iter) {
    const std::string text = random_text(rng, 1 + rng() % 60);
    const auto ids = t.encode(text, /*allow_special=*/false);
    ASSERT_EQ(t.decode(ids), text) << "iter " << iter;
    bool valid = false;
    ASSERT_EQ(stream_all(t, ids, true, &valid), text) << "iter " << iter;
    ASSERT_TRUE(valid);
  }
}

TEST(HouseTokenizer, RandomBytesRoundTripWhenValid) {
  const Tokenizer& t = house();
  std::mt19937 rng(99);
  int valid_inputs = 0;
  for (int iter = 0; iter < 2000; ++iter) {
    std::string bytes(1 + rng() % 12, '\0');
    for (char& c : bytes) c = char(rng() % 4 == 0 ? rng() % 128 : 0x80 + rng() % 128);
    const auto ids = t.encode(bytes, false);
    const std::string decoded = t.decode(ids);
    if (tok::is_valid_utf8(bytes)) {
      ++valid_inputs;
      ASSERT_EQ(decoded, bytes);
    } else {  // invalid input is encoded as its U+FFFD-repaired form
      ASSERT_EQ(decoded, tok::to_valid_utf8(bytes));
    }
  }
  EXPECT_GT(valid_inputs, 50);
}

// Random id sequences: stream pieces are valid UTF-8 and concatenate to decode(all).
TEST(HouseTokenizer, RandomIdsStreamMatchesDecode) {
  const Tokenizer& t = house();
  std::mt19937 rng(7);
  for (int iter = 0; iter < 300; ++iter) {
    std::vector<int32_t> ids(1 + rng() % 20);
    // Mostly byte tokens (ids below ~260 in this vocabulary) to provoke split characters.
    for (int32_t& id : ids) id = int32_t(rng() % 3 == 0 ? rng() % 8192 : rng() % 260);
    for (bool skip : {false, true}) {
      bool valid = false;
      ASSERT_EQ(stream_all(t, ids, skip, &valid), t.decode(ids, skip)) << "iter " << iter;
      ASSERT_TRUE(valid) << "iter " << iter;
    }
  }
}

TEST(HouseTokenizer, LongInputs) {
  const Tokenizer& t = house();
  for (const std::string& text :
       {std::string(200000, ' '), std::string(100000, 'a'), std::string(50000, '\n'),
        std::string(30000, '7'), std::string("x") + std::string(100000, '\t') + "y"}) {
    EXPECT_EQ(t.decode(t.encode(text)), text) << text.size();
  }
}

TEST(HouseTokenizer, ConcurrentEncodeMatchesSerial) {
  const Tokenizer& t = house();
  const auto cases = load_cases();
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int w = 0; w < 4; ++w) {
    threads.emplace_back([&, w] {
      for (int rep = 0; rep < 20; ++rep) {
        for (const Case& c : cases) {
          if (t.encode(c.text) != c.ids || t.decode(c.ids) != c.decoded) ++mismatches[w];
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int m : mismatches) EXPECT_EQ(m, 0);
}

// A conversation continued (vLLM's continue_final_message): the closed conversation's text cut
// right after the final assistant message's content; refused where there is no such message or
// the template does not write its content as sent.
TEST(HouseTokenizer, ChatContinuingCutsAfterTheFinalAssistantContent) {
  auto enc = PromptEncoder::load(kShared + "/models/house-llama", house());
  ASSERT_TRUE(enc.ok()) << enc.status().to_string();
  const nlohmann::ordered_json open = nlohmann::ordered_json::parse(
      R"([{"role":"user","content":"Name a colour."},{"role":"assistant","content":"Blue, or"}])");
  auto closed = enc->render_chat(open, false);
  ASSERT_TRUE(closed.ok());
  const size_t at = closed->rfind("Blue, or");
  ASSERT_NE(at, std::string::npos);
  ASSERT_GT(closed->size(), at + 8) << "the template closes the turn after the content";
  auto ids = enc->encode_chat_continuing(open);
  ASSERT_TRUE(ids.ok()) << ids.status().to_string();
  EXPECT_EQ(*ids, house().encode(closed->substr(0, at + 8), /*allow_special=*/true));
  for (const char* bad :
       {R"([{"role":"user","content":"Name a colour."}])",
        R"([{"role":"user","content":"x"},{"role":"assistant","content":""}])",
        R"([{"role":"user","content":"x"},{"role":"assistant","content":[{"type":"text"}]}])"}) {
    auto r = enc->encode_chat_continuing(nlohmann::ordered_json::parse(bad));
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
  }
  // A template that rewrites the content leaves no place to continue from.
  const std::string path = ::testing::TempDir() + "/upper_template.jinja";
  std::ofstream(path) << "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] | upper }}"
                         "</s>{% endfor %}";
  auto upper = PromptEncoder::load(kShared + "/models/house-llama", house(), path);
  ASSERT_TRUE(upper.ok()) << upper.status().to_string();
  auto r = upper->encode_chat_continuing(open);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("does not write the final message's content"),
            std::string::npos)
      << r.status().to_string();
}

}  // namespace
}  // namespace strata
