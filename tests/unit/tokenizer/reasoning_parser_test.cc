// The reasoning parser (--reasoning-parser): splitting whole texts and the same texts cut into
// every pair of pieces (a tag split between two pushes never leaks into either field), where the
// reasoning starts (the output's tag, the prompt's, or always), tool sections, buffered
// reasoning, and the tag tokens a decoder that skips special tokens keeps.
#include "tokenizer/reasoning_parser.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tokenizer/tokenizer.h"

namespace strata {
namespace {

ReasoningFormat format(const char* name) {
  auto f = reasoning_format(name);
  EXPECT_TRUE(f.ok()) << f.status().message();
  return *f;
}

struct Split {
  std::string reasoning, content;
  bool operator==(const Split&) const = default;
};

std::ostream& operator<<(std::ostream& os, const Split& s) {
  return os << "{reasoning '" << s.reasoning << "', content '" << s.content << "'}";
}

Split run(const ReasoningFormat& f, bool inside, const std::vector<std::string_view>& pieces,
          bool stream_reasoning = true) {
  ReasoningSplitter s(f, inside, stream_reasoning);
  Split out;
  for (std::string_view p : pieces) {
    ReasoningSplitter::Parts parts = s.push(p);
    out.reasoning += parts.reasoning;
    out.content += parts.content;
  }
  ReasoningSplitter::Parts tail = s.finish();
  out.reasoning += tail.reasoning;
  out.content += tail.content;
  return out;
}

// The text whole, then cut at every position into two pushes and into single bytes: the same
// split every time.
void expect_split(const ReasoningFormat& f, bool inside, const std::string& text,
                  const Split& want) {
  EXPECT_EQ(run(f, inside, {text}), want) << "whole: " << text;
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    const std::string_view v(text);
    EXPECT_EQ(run(f, inside, {v.substr(0, cut), v.substr(cut)}), want)
        << "cut at " << cut << ": " << text;
  }
  std::vector<std::string_view> bytes;
  for (size_t i = 0; i < text.size(); ++i) bytes.push_back(std::string_view(text).substr(i, 1));
  EXPECT_EQ(run(f, inside, bytes), want) << "byte by byte: " << text;
}

TEST(ReasoningParser, KnownNamesAndAClearErrorForOthers) {
  for (const char* name :
       {"deepseek-r1", "deepseek-v3", "qwen3", "qwen3-thinking", "glm45", "kimi", "kimi_k2"})
    EXPECT_TRUE(reasoning_format(name).ok()) << name;
  auto bad = reasoning_format("gpt-oss");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("unknown parser 'gpt-oss'"), std::string::npos);
  EXPECT_NE(bad.status().message().find("kimi_k2"), std::string::npos);
}

TEST(ReasoningParser, TheOutputOpensTheReasoning) {
  const ReasoningFormat q = format("qwen3");
  expect_split(q, false, "<think>\nLet me add.\n</think>\n\n4", {"\nLet me add.\n", "\n\n4"});
  expect_split(q, false, "\n<think>a</think>b", {"a", "b"});  // white space before the tag
  expect_split(q, false, "The answer is 4.", {"", "The answer is 4."});
  // A tag after other text is content, verbatim.
  expect_split(q, false, "4 <think>x</think>", {"", "4 <think>x</think>"});
  // Cut short inside the reasoning: all of it is reasoning.
  expect_split(q, false, "<think>still thinking</thi", {"still thinking</thi", ""});
  // Only a tag's beginning, then the end: content.
  expect_split(q, false, "<thi", {"", "<thi"});
  // Kimi's own tags.
  expect_split(format("kimi"), false, "\u25c1think\u25b7r\u25c1/think\u25b7c", {"r", "c"});
}

TEST(ReasoningParser, ThePromptOrTheFormatOpensTheReasoning) {
  const ReasoningFormat v3 = format("deepseek-v3");
  expect_split(v3, true, "plan</think>answer", {"plan", "answer"});
  expect_split(v3, true, "<think>plan</think>answer", {"plan", "answer"});  // the tag again
  expect_split(v3, true, "no end tag", {"no end tag", ""});
  const ReasoningFormat r1 = format("deepseek-r1");
  EXPECT_TRUE(r1.always_thinking);
  expect_split(r1, true, "hmm</think>42", {"hmm", "42"});
  expect_split(r1, true, "", {"", ""});
}

TEST(ReasoningParser, AToolSectionEndsTheReasoningAndStaysInContent) {
  const ReasoningFormat k2 = format("kimi_k2");
  expect_split(k2, false, "<think>call it<|tool_calls_section_begin|>x",
               {"call it", "<|tool_calls_section_begin|>x"});
  expect_split(k2, false, "<think>a</think>b<|tool_calls_section_begin|>",
               {"a", "b<|tool_calls_section_begin|>"});
}

TEST(ReasoningParser, ReasoningStreamsAsItComesOrWhole) {
  const ReasoningFormat q = format("qwen3");
  ReasoningSplitter streamed(q, false);
  EXPECT_EQ(streamed.push("<think>one ").reasoning, "one ");
  EXPECT_EQ(streamed.push("two</").reasoning, "two");  // "</" may be the end tag: held
  ReasoningSplitter::Parts end = streamed.push("think>three");
  EXPECT_EQ(end.reasoning, "");
  EXPECT_EQ(end.content, "three");

  ReasoningSplitter whole(q, false, /*stream_reasoning=*/false);
  EXPECT_EQ(whole.push("<think>one ").reasoning, "");
  EXPECT_EQ(whole.push("two").reasoning, "");
  end = whole.push("</think>three");
  EXPECT_EQ(end.reasoning, "one two");
  EXPECT_EQ(end.content, "three");
  EXPECT_EQ(run(q, false, {"<think>cut ", "short"}, false), (Split{"cut short", ""}));
}

// house-llama's tokenizer with <think> and </think> added as special tokens.
Tokenizer thinking_tokenizer(int32_t* think, int32_t* end_think) {
  std::ifstream in(std::string(STRATA_SHARED_DIR) + "/models/house-llama/tokenizer.json");
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(ss.str());
  auto base = Tokenizer::from_json_text(ss.str());
  EXPECT_TRUE(base.ok());
  *think = int32_t(base->vocab_size());
  *end_think = *think + 1;
  for (auto [id, tag] : {std::pair{*think, "<think>"}, std::pair{*end_think, "</think>"}})
    j["added_tokens"].push_back({{"id", id},
                                 {"content", tag},
                                 {"special", true},
                                 {"single_word", false},
                                 {"lstrip", false},
                                 {"rstrip", false},
                                 {"normalized", false}});
  auto t = Tokenizer::from_json_text(j.dump());
  EXPECT_TRUE(t.ok()) << t.status().message();
  return std::move(*t);
}

TEST(ReasoningParser, SpecialTagTokensReachTheText) {
  int32_t think = 0, end_think = 0;
  const Tokenizer tok = thinking_tokenizer(&think, &end_think);
  const ReasoningFormat q = format("qwen3");
  const std::vector<int32_t> keep = reasoning_tag_token_ids(q, tok);
  EXPECT_EQ(keep, (std::vector<int32_t>{think, end_think}));
  std::vector<int32_t> ids = {think};
  for (int32_t id : tok.encode("plan")) ids.push_back(id);
  ids.push_back(end_think);
  for (int32_t id : tok.encode("done")) ids.push_back(id);
  EXPECT_EQ(tok.decode(ids, /*skip_special=*/true), "plandone");  // the default drops the tags
  EXPECT_EQ(tok.decode(ids, true, keep), "<think>plan</think>done");
  StreamDecoder dec(tok, /*skip_special=*/true, keep);
  std::string streamed;
  for (int32_t id : ids) streamed += dec.push(id);
  streamed += dec.finish();
  EXPECT_EQ(streamed, "<think>plan</think>done");
  EXPECT_EQ(run(q, false, {streamed}), (Split{"plan", "done"}));
  // A prompt that ends with the start tag (and a newline) opens the reasoning.
  std::vector<int32_t> prompt = tok.encode("question");
  EXPECT_FALSE(starts_inside_reasoning(q, tok, prompt));
  prompt.push_back(think);
  for (int32_t id : tok.encode("\n")) prompt.push_back(id);
  EXPECT_TRUE(starts_inside_reasoning(q, tok, prompt));
  EXPECT_TRUE(starts_inside_reasoning(format("deepseek-r1"), tok, tok.encode("question")));
}

}  // namespace
}  // namespace strata
