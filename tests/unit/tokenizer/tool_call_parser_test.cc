// The tool-call parser (--tool-call-parser): each format's calls out of whole texts and out of the
// same texts cut into every pair of pieces and into single bytes (a tag split between pushes never
// leaks), the text around them kept as content, and everything that does not parse kept as the
// model wrote it (bad arguments, a missing name, a call cut short, a section never closed).
#include "tokenizer/tool_call_parser.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tokenizer/reasoning_parser.h"

namespace strata {
namespace {

ToolCallFormat format(const char* name) {
  auto f = tool_call_format(name);
  EXPECT_TRUE(f.ok()) << f.status().message();
  return *f;
}

struct Split {
  std::string content;
  std::vector<std::string> calls;  // "name arguments [model_id]"
  bool operator==(const Split&) const = default;
};

std::ostream& operator<<(std::ostream& os, const Split& s) {
  os << "{content '" << s.content << "', calls";
  for (const std::string& c : s.calls) os << " <" << c << ">";
  return os << "}";
}

void add(Split& s, ToolCallSplitter::Parts parts) {
  s.content += parts.content;
  for (const ToolCall& c : parts.calls)
    s.calls.push_back(c.name + " " + c.arguments + (c.model_id.empty() ? "" : " " + c.model_id));
}

Split run(const ToolCallFormat& f, const std::vector<std::string_view>& pieces) {
  ToolCallSplitter s(f);
  Split out;
  for (std::string_view p : pieces) add(out, s.push(p));
  add(out, s.finish());
  return out;
}

// The text whole, then cut at every position into two pushes and into single bytes: the same
// split every time, and push_and_finish agrees.
void expect_split(const ToolCallFormat& f, const std::string& text, const Split& want) {
  EXPECT_EQ(run(f, {text}), want) << "whole: " << text;
  Split once;
  add(once, ToolCallSplitter(f).push_and_finish(text));
  EXPECT_EQ(once, want) << "push_and_finish: " << text;
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    const std::string_view v(text);
    EXPECT_EQ(run(f, {v.substr(0, cut), v.substr(cut)}), want) << "cut at " << cut << ": " << text;
  }
  std::vector<std::string_view> bytes;
  for (size_t i = 0; i < text.size(); ++i) bytes.push_back(std::string_view(text).substr(i, 1));
  EXPECT_EQ(run(f, bytes), want) << "byte by byte: " << text;
}

TEST(ToolCallParser, KnownNamesAndAClearErrorForOthers) {
  for (const char* name :
       {"kimi_k2", "deepseekv3", "deepseekv31", "qwen25", "qwen", "hermes", "llama3"})
    EXPECT_TRUE(tool_call_format(name).ok()) << name;
  auto bad = tool_call_format("pythonic");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("unknown parser 'pythonic'"), std::string::npos);
  EXPECT_NE(bad.status().message().find("kimi_k2"), std::string::npos);
}

const char* kKimiCall =
    "<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": "
    "\"Paris\"}<|tool_call_end|>";

TEST(ToolCallParser, KimiK2) {
  const ToolCallFormat k = format("kimi_k2");
  const std::string section = std::string("<|tool_calls_section_begin|>") + kKimiCall +
                              "<|tool_call_begin|>functions.search.web:1<|tool_call_argument_"
                              "begin|>{}<|tool_call_end|><|tool_calls_section_end|>";
  expect_split(k, "Let me look." + section,
               {"Let me look.",
                {"get_weather {\"city\": \"Paris\"} functions.get_weather:0",
                 "search.web {} functions.search.web:1"}});
  // No section: all content; text after the section is content again.
  expect_split(k, "The weather is fine.", {"The weather is fine.", {}});
  expect_split(k, section + "\ndone",
               {"\ndone",
                {"get_weather {\"city\": \"Paris\"} "
                 "functions.get_weather:0",
                 "search.web {} functions.search.web:1"}});
  // SGLang's fallback id without "functions."; white space inside the call.
  expect_split(k,
               "<|tool_calls_section_begin|>\n<|tool_call_begin|> lookup:3 "
               "<|tool_call_argument_begin|> {\"q\": [1, 2]} <|tool_call_end|>\n"
               "<|tool_calls_section_end|>",
               {"", {"lookup {\"q\": [1, 2]} lookup:3"}});
}

TEST(ToolCallParser, WhatDoesNotParseStaysAsWritten) {
  const ToolCallFormat k = format("kimi_k2");
  // Arguments that are not a JSON object; a call without its index.
  for (const char* bad :
       {"<|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>[1]<|tool_call_end|>",
        "<|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{\"a\":<|tool_call_end|>",
        "<|tool_call_begin|>functions.f<|tool_call_argument_begin|>{}<|tool_call_end|>"}) {
    const std::string text =
        std::string("<|tool_calls_section_begin|>") + bad + "<|tool_calls_section_end|>";
    expect_split(k, text, {text, {}});
  }
  // One good call, one bad: the good one parses, the bad one is content with the section's tags.
  const std::string bad = "<|tool_call_begin|>oops<|tool_call_end|>";
  expect_split(
      k,
      std::string("<|tool_calls_section_begin|>") + kKimiCall + bad + "<|tool_calls_section_end|>",
      {"<|tool_calls_section_begin|>" + bad + "<|tool_calls_section_end|>",
       {"get_weather {\"city\": \"Paris\"} functions.get_weather:0"}});
  // Cut short inside a call (max_tokens): as written.
  const std::string cut = "ok <|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_";
  expect_split(k, cut, {cut, {}});
  // A section that never closes after a call: the call parses, what follows is content.
  expect_split(k, std::string("<|tool_calls_section_begin|>") + kKimiCall + " and more",
               {" and more", {"get_weather {\"city\": \"Paris\"} functions.get_weather:0"}});
  // An empty section, and one that holds only text.
  expect_split(k, "<|tool_calls_section_begin|><|tool_calls_section_end|>x",
               {"<|tool_calls_section_begin|><|tool_calls_section_end|>x", {}});
  expect_split(k, "<|tool_calls_section_begin|> hello", {"<|tool_calls_section_begin|> hello", {}});
}

TEST(ToolCallParser, DeepSeekV3AndV31) {
  const std::string begin = "<\uff5ctool\u2581calls\u2581begin\uff5c>",
                    end = "<\uff5ctool\u2581calls\u2581end\uff5c>",
                    call = "<\uff5ctool\u2581call\u2581begin\uff5c>",
                    call_end = "<\uff5ctool\u2581call\u2581end\uff5c>",
                    sep = "<\uff5ctool\u2581sep\uff5c>";
  expect_split(
      format("deepseekv3"),
      "Checking." + begin + call + "function" + sep +
          "get_weather\n```json\n{\"location\": \"Tokyo\"}\n```" + call_end + call + "function" +
          sep + "get_weather\n```json\n{\"location\": \"Paris\"}\n```" + call_end + end,
      {"Checking.",
       {"get_weather {\"location\": \"Tokyo\"}", "get_weather {\"location\": \"Paris\"}"}});
  // V3's body without the code fence does not parse.
  const std::string unfenced = begin + call + "function" + sep + "f\n{}" + call_end + end;
  expect_split(format("deepseekv3"), unfenced, {unfenced, {}});
  expect_split(format("deepseekv31"),
               begin + call + "get_weather" + sep + "{\"location\": \"Tokyo\"}" + call_end + end,
               {"", {"get_weather {\"location\": \"Tokyo\"}"}});
}

TEST(ToolCallParser, QwenJsonCalls) {
  const ToolCallFormat q = format("qwen25");
  expect_split(q,
               "I'll check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
               "\"Paris\", \"unit\": \"c\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", "
               "\"arguments\": {}}\n</tool_call>",
               {"I'll check.\n", {"get_weather {\"city\":\"Paris\",\"unit\":\"c\"}", "now {}"}});
  // The model's key order is kept (not sorted); "parameters" and arguments written as a string.
  expect_split(q, "<tool_call>{\"name\": \"f\", \"parameters\": {\"z\": 1, \"a\": 2}}</tool_call>",
               {"", {"f {\"z\":1,\"a\":2}"}});
  expect_split(q, "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"x\\\": 1}\"}</tool_call>",
               {"", {"f {\"x\":1}"}});
  // Text after the calls is content; a call without a name is content.
  expect_split(q, "<tool_call>{\"name\": \"f\"}</tool_call>\nbye", {"\nbye", {"f {}"}});
  const std::string nameless = "<tool_call>{\"arguments\": {}}</tool_call>";
  expect_split(q, nameless, {nameless, {}});
  // Non-ASCII arguments stay UTF-8.
  expect_split(q, "<tool_call>{\"name\": \"f\", \"arguments\": {\"city\": \"東京\"}}</tool_call>",
               {"", {"f {\"city\":\"東京\"}"}});
}

TEST(ToolCallParser, Llama3WholeOutput) {
  const ToolCallFormat l = format("llama3");
  expect_split(l, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
               {"", {"get_weather {\"city\":\"Paris\"}"}});
  expect_split(l,
               "<|python_tag|>{\"name\": \"a\", \"parameters\": {\"s\": \"}{;\"}}; {\"name\": "
               "\"b\", \"parameters\": {}}",
               {"", {"a {\"s\":\"}{;\"}", "b {}"}});
  // Prose, or JSON that is no call: content as written.
  expect_split(l, "The answer is {1}.", {"The answer is {1}.", {}});
  expect_split(l, "{\"answer\": 4}", {"{\"answer\": 4}", {}});
  expect_split(l, "{\"name\": \"a\"} trailing", {"{\"name\": \"a\"} trailing", {}});
  expect_split(l, "  ", {"  ", {}});
}

// Kimi K2.5 thinks, then calls: the reasoning parser ends the reasoning at the call section's tag
// and leaves the section in the content, where the tool-call parser takes the calls (the server
// chains the two this way, whole and streamed piece by piece).
TEST(ToolCallParser, AfterTheReasoningParser) {
  auto reasoning = reasoning_format("kimi_k2");
  ASSERT_TRUE(reasoning.ok());
  const ToolCallFormat k = format("kimi_k2");
  for (const std::string text :
       {std::string("<think>check the weather</think>Sure.<|tool_calls_section_begin|>") +
            kKimiCall + "<|tool_calls_section_end|>",
        std::string("<think>check the weather<|tool_calls_section_begin|>") + kKimiCall +
            "<|tool_calls_section_end|>"}) {
    const bool closed = text.find("</think>") != std::string::npos;
    for (size_t step : {text.size(), size_t(1), size_t(5)}) {
      ReasoningSplitter rs(*reasoning, /*starts_inside=*/false);
      ToolCallSplitter ts(k);
      std::string thought;
      Split out;
      for (size_t i = 0; i < text.size(); i += step) {
        ReasoningSplitter::Parts p = rs.push(std::string_view(text).substr(i, step));
        thought += p.reasoning;
        add(out, ts.push(p.content));
      }
      ReasoningSplitter::Parts p = rs.finish();
      thought += p.reasoning;
      add(out, ts.push_and_finish(p.content));
      EXPECT_EQ(thought, "check the weather") << text << " step " << step;
      EXPECT_EQ(out, (Split{closed ? "Sure." : "",
                            {"get_weather {\"city\": \"Paris\"} functions.get_weather:0"}}))
          << text << " step " << step;
    }
  }
}

// house-llama's tokenizer with Kimi K2's section tags added as special tokens.
TEST(ToolCallParser, SpecialTagTokensReachTheText) {
  std::ifstream in(std::string(STRATA_SHARED_DIR) + "/models/house-llama/tokenizer.json");
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(ss.str());
  auto base = Tokenizer::from_json_text(ss.str());
  ASSERT_TRUE(base.ok());
  const int32_t first = int32_t(base->vocab_size());
  const ToolCallFormat k = format("kimi_k2");
  int32_t id = first;
  for (const std::string* tag :
       {&k.section_begin, &k.section_end, &k.call_begin, &k.call_end, &k.separator})
    j["added_tokens"].push_back({{"id", id++},
                                 {"content", *tag},
                                 {"special", true},
                                 {"single_word", false},
                                 {"lstrip", false},
                                 {"rstrip", false},
                                 {"normalized", false}});
  auto tok = Tokenizer::from_json_text(j.dump());
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  EXPECT_EQ(tool_call_tag_token_ids(k, *tok),
            (std::vector<int32_t>{first, first + 1, first + 2, first + 3, first + 4}));
  EXPECT_TRUE(tool_call_tag_token_ids(format("qwen25"), *tok).empty());  // plain text there
}

}  // namespace
}  // namespace strata
