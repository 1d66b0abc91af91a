// Dataset specs, the per-prompt seed, and OpenAI request/reply handling (pure parts of the
// server target) and the backoff policy.
#include "pipeline/dataset.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "pipeline/server_target.h"

namespace strata {
namespace {

TEST(DatasetSpec, NameEqualsFileAndBareFile) {
  auto d = parse_dataset_spec("define=/data/prompts-define.jsonl");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->name, "define");
  EXPECT_EQ(d->path, "/data/prompts-define.jsonl");
  d = parse_dataset_spec("/data/prompts-explain.jsonl");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->name, "prompts-explain");
  EXPECT_FALSE(parse_dataset_spec("=x.jsonl").ok());
  EXPECT_FALSE(parse_dataset_spec("a=").ok());
  EXPECT_FALSE(parse_dataset_spec("a/b=x.jsonl").ok());  // would escape --output-dir
}

TEST(DatasetSpec, LoadsTheSharedPrompts) {
  auto d = parse_dataset_spec(std::string("explain=") + STRATA_SHARED_DIR +
                              "/data/prompts-explain.jsonl");
  ASSERT_TRUE(d.ok());
  ASSERT_TRUE(load_dataset(*d).ok());
  ASSERT_EQ(d->records.size(), 3000u);
  EXPECT_EQ(d->records[0].id, "explain-00000");
  EXPECT_EQ(d->records[0].messages[0]["role"], "user");
  auto missing = parse_dataset_spec("x=/nonexistent/file.jsonl");
  ASSERT_TRUE(missing.ok());
  EXPECT_EQ(load_dataset(*missing).code(), StatusCode::kNotFound);
}

TEST(PromptSeed, MatchesTheDocumentedHashAndDependsOnlyOnSeedAndId) {
  // Values from an independent Python implementation of FNV-1a + splitmix64 (dataset.cc).
  EXPECT_EQ(prompt_seed(0, "define-00000"), 5106128956112826967ull);
  EXPECT_EQ(prompt_seed(42, "define-00000"), 8357999837833331606ull);
  EXPECT_EQ(prompt_seed(0, ""), 7625481859077937184ull);
  EXPECT_NE(prompt_seed(0, "define-00001"), prompt_seed(0, "define-00000"));
  EXPECT_LE(prompt_seed(12345, "x"), uint64_t(INT64_MAX));
}

TEST(ServerUrl, Parses) {
  auto u = parse_server_url("http://127.0.0.1:30000");
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->scheme_host_port, "http://127.0.0.1:30000");
  EXPECT_EQ(u->prefix, "");
  u = parse_server_url("http://host:8000/v1/");
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->scheme_host_port, "http://host:8000");
  EXPECT_EQ(u->prefix, "");
  u = parse_server_url("http://host/proxy/v1");
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->prefix, "/proxy");
  EXPECT_FALSE(parse_server_url("host:8000").ok());
  EXPECT_FALSE(parse_server_url("https://host").ok());
  EXPECT_FALSE(parse_server_url("http://").ok());
}

TEST(OpenAiBody, ChatAndCompletion) {
  auto chat = parse_prompt_line(
      R"({"id":"a","conversations":[{"from":"human","value":"hi"},{"from":"gpt","value":"old"}]})",
      1, "d");
  ASSERT_TRUE(chat.ok());
  JobSampling s{.params = {.temperature = 0.7f,
                           .top_p = 0.9f,
                           .top_k = 20,
                           .max_new_tokens = 64,
                           .stop_strings = {"END"}}};
  nlohmann::json b = openai_request_body(*chat, s, "m", 99);
  EXPECT_EQ(b["model"], "m");
  EXPECT_EQ(b["max_tokens"], 64);
  EXPECT_EQ(b["seed"], 99);
  EXPECT_EQ(b["top_k"], 20);
  EXPECT_EQ(b["stop"], nlohmann::json({"END"}));
  EXPECT_EQ(b["stream"], false);
  EXPECT_FALSE(b.contains("ignore_eos"));
  EXPECT_FALSE(b.contains("min_tokens"));
  // The old assistant turn is dropped: the model regenerates it.
  EXPECT_EQ(b["messages"], nlohmann::json::parse(R"([{"role":"user","content":"hi"}])"));
  auto raw = parse_prompt_line(R"({"prompt":"Once upon"})", 3, "d");
  ASSERT_TRUE(raw.ok());
  b = openai_request_body(*raw, JobSampling{.params = {.min_new_tokens = 5, .ignore_eos = true}},
                          "m", 1);
  EXPECT_EQ(b["prompt"], "Once upon");
  EXPECT_FALSE(b.contains("messages"));
  EXPECT_FALSE(b.contains("top_k"));
  EXPECT_EQ(b["ignore_eos"], true);
  EXPECT_EQ(b["min_tokens"], 5);
}

// A record with tools: the tools kept in their key order, the conversation's calls and tool
// results kept (OpenAI's layout), the calls' arguments parsed for the chat template, the calls
// counted, and the server request carrying the tools as written.
TEST(Dataset, ToolsAndToolCalls) {
  auto r = parse_prompt_line(
      R"({"id":"t","tools":[{"type":"function","function":{"name":"get","parameters":{"type":
          "object","properties":{"zone":{},"city":{}}}}}],
          "messages":[{"role":"user","content":"weather?"},
            {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function",
              "function":{"name":"get","arguments":"{\"z\": 1, \"a\": 2}"}}]},
            {"role":"tool","tool_call_id":"c1","content":"sunny"},
            {"role":"assistant","content":"Sunny."}]})",
      1, "d");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->tools.dump(),
            R"([{"type":"function","function":{"name":"get","parameters":{"type":"object",)"
            R"("properties":{"zone":{},"city":{}}}}}])");
  EXPECT_EQ(r->messages[1]["content"], "");
  EXPECT_EQ(r->messages[2]["tool_call_id"], "c1");
  const nlohmann::ordered_json t = template_messages(r->messages);
  EXPECT_EQ(t[1]["tool_calls"][0]["function"]["arguments"].dump(), R"({"z":1,"a":2})");
  EXPECT_EQ(count_tool_calls(r->messages), 1);
  const nlohmann::ordered_json ctx = template_context(*r, {{"enable_thinking", false}});
  EXPECT_EQ(ctx["tools"], r->tools);
  EXPECT_EQ(ctx["enable_thinking"], false);
  const nlohmann::ordered_json body = openai_request_body(*r, JobSampling{}, "m", 1);
  EXPECT_EQ(body["tools"].dump(), r->tools.dump());
  EXPECT_EQ(body["messages"].size(), 3u);  // the last answer is regenerated
  EXPECT_EQ(body["messages"][1]["tool_calls"][0]["function"]["arguments"], R"({"z": 1, "a": 2})");
  // Records without tools have none in the request or the template's context.
  auto plain = parse_prompt_line(R"({"messages":[{"role":"user","content":"x"}]})", 2, "d");
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(openai_request_body(*plain, JobSampling{}, "m", 1).contains("tools"));
  EXPECT_FALSE(template_context(*plain, nullptr).contains("tools"));
  for (const char* bad : {
           R"({"tools":{"a":1},"messages":[{"role":"user","content":"x"}]})",
           R"({"tools":[{"type":"function"}],"messages":[{"role":"user","content":"x"}]})",
           R"({"messages":[{"role":"assistant","tool_calls":{"a":1}}]})",
           R"({"messages":[{"role":"assistant","tool_calls":[{"function":{"arguments":"{}"}}]}]})",
           R"({"messages":[{"role":"tool","content":"x","tool_call_id":7}]})",
       }) {
    auto e = parse_prompt_line(bad, 4, "d");
    EXPECT_FALSE(e.ok()) << bad;
    EXPECT_NE(e.status().message().find("d line 4"), std::string::npos) << e.status().message();
  }
}

// The in-process parse of an answer: calls to tool_calls with ids (Kimi K2's counting the
// conversation's calls), finish_reason "tool_calls" after a stop; an answer without calls
// unchanged.
TEST(Dataset, SplitToolCalls) {
  GenerationOutcome o;
  o.text =
      "ok<|tool_calls_section_begin|><|tool_call_begin|>functions.get:0"
      "<|tool_call_argument_begin|>{\"city\": \"Rome\"}<|tool_call_end|>"
      "<|tool_calls_section_end|>";
  o.finish_reason = "stop";
  split_tool_calls(*tool_call_format("kimi_k2"), 2, &o);
  EXPECT_EQ(o.text, "ok");
  EXPECT_EQ(o.finish_reason, "tool_calls");
  EXPECT_EQ(o.tool_calls, nlohmann::json::parse(R"([{"id":"functions.get:2","type":"function",
      "function":{"name":"get","arguments":"{\"city\": \"Rome\"}"}}])"));
  GenerationOutcome plain;
  plain.text = "no call";
  plain.finish_reason = "stop";
  split_tool_calls(*tool_call_format("kimi_k2"), 0, &plain);
  EXPECT_EQ(plain.text, "no call");
  EXPECT_EQ(plain.finish_reason, "stop");
  EXPECT_TRUE(plain.tool_calls.is_null());
}

TEST(OpenAiReply, RepliesCutShortAreRetriedNotWritten) {
  JobSampling s;
  s.params.max_new_tokens = 100;
  GenerationOutcome o;
  o.finish_reason = "stop";
  o.completion_tokens = 3;
  EXPECT_TRUE(check_not_cut_short(o, s).ok());  // EOS before the limit
  o.finish_reason = "length";
  o.completion_tokens = 100;
  EXPECT_TRUE(check_not_cut_short(o, s).ok());
  o.completion_tokens = 40;  // a drained server's reply
  EXPECT_EQ(check_not_cut_short(o, s).code(), StatusCode::kUnavailable);
  EXPECT_NE(check_not_cut_short(o, s).message().find("40 of 100"), std::string::npos);
  o.finish_reason = "abort";
  EXPECT_FALSE(check_not_cut_short(o, s).ok());
}

TEST(OpenAiReply, Parses) {
  GenerationOutcome o;
  ASSERT_TRUE(
      parse_openai_reply(
          R"({"choices":[{"message":{"role":"assistant","content":"hello"},"finish_reason":"length"}],
                      "usage":{"prompt_tokens":5,"completion_tokens":7}})",
          true, o)
          .ok());
  EXPECT_EQ(o.text, "hello");
  EXPECT_EQ(o.reasoning, "");
  EXPECT_EQ(o.finish_reason, "length");
  EXPECT_EQ(o.prompt_tokens, 5);
  EXPECT_EQ(o.completion_tokens, 7);
  GenerationOutcome c;
  ASSERT_TRUE(
      parse_openai_reply(R"({"choices":[{"text":"abc","finish_reason":"stop"}]})", false, c).ok());
  EXPECT_EQ(c.text, "abc");
  GenerationOutcome n;
  ASSERT_TRUE(parse_openai_reply(R"({"choices":[{"message":{"content":null}}]})", true, n).ok());
  EXPECT_EQ(n.text, "");
  EXPECT_TRUE(n.tool_calls.is_null());
  // A server with a tool-call parser: its calls are kept as it wrote them.
  GenerationOutcome t;
  ASSERT_TRUE(parse_openai_reply(R"({"choices":[{"message":{"content":null,"tool_calls":[
      {"id":"call_1","type":"function","function":{"name":"f","arguments":"{}"}}]},
      "finish_reason":"tool_calls"}]})",
                                 true, t)
                  .ok());
  EXPECT_EQ(t.text, "");
  EXPECT_EQ(t.tool_calls[0]["id"], "call_1");
  EXPECT_EQ(t.finish_reason, "tool_calls");
  // A server with a reasoning parser: SGLang's field, and vLLM's newer name.
  for (const char* key : {"reasoning_content", "reasoning"}) {
    GenerationOutcome r;
    ASSERT_TRUE(parse_openai_reply(fmt::format(R"({{"choices":[{{"message":{{"content":"4",
                                                   "{}":"2 + 2"}}}}]}})",
                                               key),
                                   true, r)
                    .ok());
    EXPECT_EQ(r.text, "4");
    EXPECT_EQ(r.reasoning, "2 + 2") << key;
  }
  EXPECT_FALSE(parse_openai_reply("<html>", true, o).ok());
  EXPECT_FALSE(parse_openai_reply(R"({"choices":[]})", true, o).ok());
  EXPECT_FALSE(
      parse_openai_reply(R"({"choices":[{"text":"x"}]})", true, o).ok());  // chat needs message
}

TEST(Backoff, GrowsIsCappedAndJittered) {
  RetryPolicy p{.initial_delay_s = 0.5, .max_delay_s = 4.0, .multiplier = 2.0};
  std::mt19937_64 rng(1);
  for (int retry = 1; retry <= 10; ++retry) {
    const double cap = std::min(4.0, 0.5 * std::pow(2.0, retry - 1));
    double lo = 1e9, hi = 0;
    for (int k = 0; k < 200; ++k) {
      const double d = backoff_delay_s(p, retry, rng);
      lo = std::min(lo, d);
      hi = std::max(hi, d);
    }
    EXPECT_GE(lo, cap * 0.5) << retry;
    EXPECT_LE(hi, cap) << retry;
    EXPECT_LT(lo, hi) << retry;  // jittered, not a constant
  }
}

}  // namespace
}  // namespace strata
