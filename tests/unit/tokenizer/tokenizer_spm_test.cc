// SentencePiece-style BPE (Llama-2 / Mistral tokenizer.json layouts) on a hand-made vocabulary,
// plus the unit pieces (UTF-8 repair, split behaviours) and error reporting.
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace strata {
namespace {

using nlohmann::json;

// Ids: <unk>=0 <s>=1 </s>=2, <0x00>..<0xFF> = 3..258, then the pieces below.
constexpr int32_t kByte0 = 3;
const std::vector<std::string> kPieces = {"▁",      "h",  "e",  "l",    "o",     "w",
                                          "r",      "d",  "▁h", "ll",   "▁he",   "▁hell",
                                          "▁hello", "or", "▁w", "▁wor", "▁worl", "▁world"};
int32_t piece_id(const std::string& p) {
  for (size_t i = 0; i < kPieces.size(); ++i) {
    if (kPieces[i] == p) return 259 + int32_t(i);
  }
  ADD_FAILURE() << "no piece " << p;
  return -1;
}

json spm_json(bool metaspace, bool byte_fallback) {
  json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
  for (int b = 0; b < 256; ++b) vocab[fmt::format("<0x{:02X}>", b)] = kByte0 + b;
  for (size_t i = 0; i < kPieces.size(); ++i) vocab[kPieces[i]] = 259 + int(i);
  auto added = [](int id, const char* content) {
    return json{{"id", id},        {"content", content},  {"single_word", false}, {"lstrip", false},
                {"rstrip", false}, {"normalized", false}, {"special", true}};
  };
  json j = {{"version", "1.0"},
            {"added_tokens", {added(0, "<unk>"), added(1, "<s>"), added(2, "</s>")}},
            {"post_processor",
             {{"type", "TemplateProcessing"},
              {"single",
               {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
              {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}}},
            {"model",
             {{"type", "BPE"},
              {"dropout", nullptr},
              {"unk_token", "<unk>"},
              {"continuing_subword_prefix", nullptr},
              {"end_of_word_suffix", nullptr},
              {"fuse_unk", true},
              {"byte_fallback", byte_fallback},
              {"vocab", vocab},
              {"merges",
               {"▁ h", "l l", "▁h e", "▁he ll", "▁hell o", "o r", "▁ w", "▁w or", "▁wor l",
                "▁worl d"}}}}};
  if (metaspace) {  // newer Mistral/Llama layout
    j["normalizer"] = nullptr;
    j["pre_tokenizer"] = {
        {"type", "Metaspace"}, {"replacement", "▁"}, {"prepend_scheme", "first"}, {"split", false}};
    j["decoder"] = {{"type", "Sequence"},
                    {"decoders",
                     {{{"type", "Metaspace"},
                       {"replacement", "▁"},
                       {"prepend_scheme", "first"},
                       {"split", false}},
                      {{"type", "ByteFallback"}},
                      {{"type", "Fuse"}}}}};
  } else {  // Llama-2 layout
    j["normalizer"] = {{"type", "Sequence"},
                       {"normalizers",
                        {{{"type", "Prepend"}, {"prepend", "▁"}},
                         {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "▁"}}}}};
    j["pre_tokenizer"] = nullptr;
    j["decoder"] = {{"type", "Sequence"},
                    {"decoders",
                     {{{"type", "Replace"}, {"pattern", {{"String", "▁"}}}, {"content", " "}},
                      {{"type", "ByteFallback"}},
                      {{"type", "Fuse"}},
                      {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}};
  }
  return j;
}

Tokenizer make(bool metaspace, bool byte_fallback = true) {
  auto r = Tokenizer::from_json_text(spm_json(metaspace, byte_fallback).dump());
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return std::move(r).value();
}

std::string stream(const Tokenizer& t, const std::vector<int32_t>& ids) {
  StreamDecoder sd(t);
  std::string out;
  for (int32_t id : ids) {
    const std::string piece = sd.push(id);
    EXPECT_TRUE(tok::is_valid_utf8(piece));
    out += piece;
  }
  return out + sd.finish();
}

TEST(SentencePieceBpe, MergesByRank) {
  for (bool metaspace : {false, true}) {
    const Tokenizer t = make(metaspace);
    const std::vector<int32_t> want = {piece_id("▁hello"), piece_id("▁world")};
    EXPECT_EQ(t.encode("hello world"), want) << metaspace;
    EXPECT_EQ(t.decode(want), "hello world") << metaspace;
    EXPECT_EQ(stream(t, want), "hello world") << metaspace;
    EXPECT_EQ(t.with_special_tokens(want), (std::vector<int32_t>{1, want[0], want[1]}));
  }
}

TEST(SentencePieceBpe, ByteFallbackForUnknownCharacters) {
  const Tokenizer t = make(false);
  // "hi 😀" -> "▁hi▁😀": 'i' and the emoji are not pieces, so they fall back to bytes.
  const std::vector<int32_t> want = {piece_id("▁h"), kByte0 + 0x69, piece_id("▁"), kByte0 + 0xF0,
                                     kByte0 + 0x9F,  kByte0 + 0x98, kByte0 + 0x80};
  EXPECT_EQ(t.encode("hi 😀"), want);
  EXPECT_EQ(t.decode(want), "hi 😀");
  EXPECT_EQ(stream(t, want), "hi 😀");
  // A broken byte run decodes to one U+FFFD per byte, as Hugging Face's ByteFallback does.
  EXPECT_EQ(t.decode(std::vector<int32_t>{piece_id("▁h"), kByte0 + 0xF0, kByte0 + 0x9F}),
            "h\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST(SentencePieceBpe, UnknownWithoutByteFallbackFusesUnk) {
  const Tokenizer t = make(false, /*byte_fallback=*/false);
  EXPECT_EQ(t.encode("hxyz"), (std::vector<int32_t>{piece_id("▁h"), 0}));
}

TEST(SentencePieceBpe, SpecialTokensAndLeadingSpace) {
  const Tokenizer legacy = make(false);
  // Prepend normalizes each text piece between special tokens: "hello" -> "▁hello".
  EXPECT_EQ(legacy.encode("<s>hello</s>"), (std::vector<int32_t>{1, piece_id("▁hello"), 2}));
  EXPECT_EQ(legacy.decode(legacy.encode("<s>hello</s>"), /*skip_special=*/true), "hello");
  // Metaspace prepend_scheme "first": only text at the very start gets the "▁".
  const Tokenizer first = make(true);
  EXPECT_EQ(first.encode("<s>hello"),
            (std::vector<int32_t>{1, piece_id("h"), piece_id("e"), piece_id("ll"), piece_id("o")}));
  EXPECT_EQ(first.encode("hello"), (std::vector<int32_t>{piece_id("▁hello")}));
  EXPECT_EQ(first.decode(std::vector<int32_t>{piece_id("▁hello"), piece_id("▁world")}),
            "hello world");
  // Strip removes only the first leading space of the whole text; streaming keeps later ones.
  const std::vector<int32_t> ids = {piece_id("▁w"), piece_id("▁w"), piece_id("▁"),
                                    piece_id("▁hello")};
  EXPECT_EQ(legacy.decode(ids), "w w  hello");
  EXPECT_EQ(stream(legacy, ids), "w w  hello");
}

// The streamed pieces concatenate to decode() for random id sequences (pieces, lone "▁", byte
// tokens that make and break UTF-8 characters, specials), both layouts and Strip variants that
// treat the start of the whole text specially. A Strip of 2 leading spaces used to lose the
// spaces of a window starting with a lone "▁"
// (fuzz/corpus/tokenizer_load/crash_stream_decoder_strip).
TEST(StreamDecoder, PiecesConcatenateToDecode) {
  std::vector<std::pair<std::string, Tokenizer>> variants;
  variants.emplace_back("legacy", make(false));
  variants.emplace_back("metaspace", make(true));
  for (int start : {2, 3}) {
    for (int stop : {0, 1}) {
      json j = spm_json(false, true);
      j["decoder"]["decoders"][3]["start"] = start;
      j["decoder"]["decoders"][3]["stop"] = stop;
      auto t = Tokenizer::from_json_text(j.dump());
      ASSERT_TRUE(t.ok()) << t.status().to_string();
      variants.emplace_back(fmt::format("strip {}/{}", start, stop), std::move(t).value());
    }
  }
  const std::vector<int32_t> bytes = {kByte0 + 0x20, kByte0 + 0x69, kByte0 + 0xC3, kByte0 + 0xA9,
                                      kByte0 + 0xF0, kByte0 + 0x9F, kByte0 + 0x98, kByte0 + 0x80};
  std::mt19937 rng(7);
  for (const auto& [name, t] : variants) {
    for (int trial = 0; trial < 400; ++trial) {
      std::vector<int32_t> ids(size_t(1 + rng() % 12));
      for (int32_t& id : ids) {
        const uint32_t kind = rng() % 8;
        if (kind < 3)
          id = piece_id("▁");
        else if (kind < 6)
          id = 259 + int32_t(rng() % kPieces.size());
        else if (kind < 7)
          id = bytes[rng() % bytes.size()];
        else
          id = int32_t(rng() % 3);  // <unk> <s> </s>
      }
      for (bool skip : {false, true}) {
        StreamDecoder sd(t, skip);
        std::string streamed;
        for (int32_t id : ids) streamed += sd.push(id);
        streamed += sd.finish();
        ASSERT_EQ(streamed, t.decode(ids, skip)) << name << " skip_special " << skip << " ids "
                                                 << fmt::format("{}", fmt::join(ids, ","));
      }
    }
  }
}

TEST(Utf8, MaximalSubpartRepair) {
  EXPECT_TRUE(tok::is_valid_utf8("héllo 😀"));
  EXPECT_FALSE(tok::is_valid_utf8("\xC0\x80"));
  EXPECT_FALSE(tok::is_valid_utf8("\xED\xA0\x80"));  // surrogate
  // Same replacement counts as Rust's String::from_utf8_lossy / Python's errors="replace".
  EXPECT_EQ(tok::to_valid_utf8("a\xF0\x9F\x98"
                               "b"),
            "a\xEF\xBF\xBD"
            "b");
  EXPECT_EQ(tok::to_valid_utf8("\xC0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(tok::to_valid_utf8("\xE0\x80\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(tok::to_valid_utf8("\xF4\x90\x80\x80"),
            "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(tok::utf8_complete_prefix_len("ab\xE6\x97"), 2u);
  EXPECT_EQ(tok::utf8_complete_prefix_len("ab\xE6\x97\xA5"), 5u);
}

TEST(SplitBehavior, MatchesHuggingFace) {
  // "the-final--countdown" split on "-" (Hugging Face's own split tests).
  const std::vector<tok::ByteRange> dashes = {{3, 4}, {9, 10}, {10, 11}};
  auto run = [&](tok::SplitBehavior b, bool invert = false) {
    std::vector<tok::ByteRange> pieces;
    tok::split_by_matches(20, dashes, invert, b, &pieces);
    std::string s = "the-final--countdown", out;
    for (auto [x, y] : pieces) out += "[" + s.substr(x, y - x) + "]";
    return out;
  };
  EXPECT_EQ(run(tok::SplitBehavior::kRemoved), "[the][final][countdown]");
  EXPECT_EQ(run(tok::SplitBehavior::kIsolated), "[the][-][final][-][-][countdown]");
  EXPECT_EQ(run(tok::SplitBehavior::kMergedWithPrevious), "[the-][final-][-][countdown]");
  EXPECT_EQ(run(tok::SplitBehavior::kMergedWithNext), "[the][-final][-][-countdown]");
  EXPECT_EQ(run(tok::SplitBehavior::kContiguous), "[the][-][final][--][countdown]");
  EXPECT_EQ(run(tok::SplitBehavior::kRemoved, /*invert=*/true), "[-][-][-]");
}

Status load_error(const json& j) {
  auto r = Tokenizer::from_json_text(j.dump(), {}, "test.json");
  return r.ok() ? Status() : r.status();
}

TEST(TokenizerErrors, MissingFileMalformedAndUnsupported) {
  auto missing = Tokenizer::load("/nonexistent/model");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("/nonexistent/model/tokenizer.json"),
            std::string::npos);

  const auto dir = std::filesystem::path(::testing::TempDir()) / "tok_bad_json";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "tokenizer.json") << "{\"model\": {";
  auto malformed = Tokenizer::load(dir.string());
  ASSERT_FALSE(malformed.ok());
  EXPECT_EQ(malformed.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(malformed.status().message().find("tokenizer.json"), std::string::npos);
  EXPECT_NE(malformed.status().message().find("malformed JSON"), std::string::npos);

  json j = spm_json(false, true);
  j["model"]["type"] = "Unigram";
  Status st = load_error(j);
  EXPECT_EQ(st.code(), StatusCode::kUnimplemented);
  EXPECT_NE(st.message().find("Unigram"), std::string::npos);
  EXPECT_NE(st.message().find("test.json"), std::string::npos);

  j = spm_json(false, true);
  j["model"]["merges"].push_back("▁ zz");
  st = load_error(j);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("'zz'"), std::string::npos) << st.message();

  j = spm_json(false, true);
  j["pre_tokenizer"] = {{"type", "Split"},
                        {"pattern", {{"Regex", "(unclosed"}}},
                        {"behavior", "Isolated"},
                        {"invert", false}};
  st = load_error(j);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("pre_tokenizer"), std::string::npos) << st.message();

  j = spm_json(false, true);
  j["decoder"] = {{"type", "CTC"}};
  EXPECT_EQ(load_error(j).code(), StatusCode::kUnimplemented);

  j = spm_json(false, true);
  j["model"]["vocab"] = "not an object";
  EXPECT_EQ(load_error(j).code(), StatusCode::kInvalidArgument);

  auto bad_config =
      Tokenizer::from_json_text(spm_json(false, true).dump(), R"({"bos_token": "<nope>"})");
  ASSERT_FALSE(bad_config.ok());
  EXPECT_NE(bad_config.status().message().find("<nope>"), std::string::npos);
  auto good_config = Tokenizer::from_json_text(
      spm_json(false, true).dump(),
      R"({"bos_token": {"content": "<s>", "__type": "AddedToken"}, "eos_token": "</s>"})");
  ASSERT_TRUE(good_config.ok());
  EXPECT_EQ(good_config->bos_id(), 1);
  EXPECT_EQ(good_config->eos_id(), 2);
}

TEST(AddedTokens, LstripRstripSingleWord) {
  json j = spm_json(false, true);
  j["added_tokens"].push_back({{"id", 300},
                               {"content", "<mask>"},
                               {"single_word", true},
                               {"lstrip", true},
                               {"rstrip", true},
                               {"normalized", false},
                               {"special", true}});
  auto r = Tokenizer::from_json_text(j.dump());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const Tokenizer& t = *r;
  // lstrip/rstrip swallow the surrounding spaces.
  EXPECT_EQ(t.encode("hello <mask> world"),
            (std::vector<int32_t>{piece_id("▁hello"), 300, piece_id("▁world")}));
  // Inside a word the single_word token is not matched.
  const auto inside = t.encode("hello<mask>");
  EXPECT_EQ(std::count(inside.begin(), inside.end(), 300), 0);
}

TEST(SentencePieceBpe, IgnoreMergesTakesWholeWordsFromVocab) {
  for (bool ignore : {false, true}) {
    json j = spm_json(true, true);
    j["pre_tokenizer"]["split"] = true;
    j["model"]["vocab"]["▁hlo"] = 400;  // reachable by no merge
    j["model"]["ignore_merges"] = ignore;
    auto r = Tokenizer::from_json_text(j.dump());
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    const std::vector<int32_t> want =
        ignore ? std::vector<int32_t>{400}
               : std::vector<int32_t>{piece_id("▁h"), piece_id("l"), piece_id("o")};
    EXPECT_EQ(r->encode("hlo"), want) << ignore;
    EXPECT_EQ(r->decode(want), "hlo");
  }
}

}  // namespace
}  // namespace strata
