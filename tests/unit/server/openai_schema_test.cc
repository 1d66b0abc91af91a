// Request parsing/validation and Prometheus rendering, without HTTP or a model.
#include <gtest/gtest.h>

#include "server/metrics.h"
#include "server/openai_schema.h"
#include "server/sse.h"

namespace strata {
namespace {

TEST(ServerSchemaTest, ParsesChatRequest) {
  OpenAiRequest r;
  auto e = parse_openai_request(
      R"({"model":"m","messages":[{"role":"system","content":"be brief"},
          {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}],
          "max_completion_tokens":7,"temperature":0,"top_p":0.5,"top_k":3,"seed":11,"stop":"x",
          "logprobs":true,"top_logprobs":2,"n":3,"stream":true,"stream_options":{"include_usage":true}})",
      Endpoint::kChat, &r);
  ASSERT_FALSE(e) << e->message;
  EXPECT_EQ(r.model, "m");
  EXPECT_EQ(r.messages[1]["content"], "ab");
  EXPECT_EQ(*r.max_tokens, 7);
  EXPECT_EQ(r.temperature, 0.0f);
  EXPECT_EQ(r.top_k, 3);
  EXPECT_EQ(*r.seed, 11u);
  EXPECT_EQ(r.stop, std::vector<std::string>{"x"});
  EXPECT_EQ(r.top_logprobs, 2);
  EXPECT_EQ(r.n, 3);
  EXPECT_TRUE(r.stream && r.include_usage);
}

TEST(ServerSchemaTest, OnlyJsonContentTypesAreAccepted) {
  for (const char* ok : {"", "application/json", "Application/JSON; charset=utf-8", " application/json ",
                         "application/vnd.api+json"})
    EXPECT_FALSE(check_json_content_type(ok)) << ok;
  for (const char* bad : {"text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
                          "application/jsonx"}) {
    auto e = check_json_content_type(bad);
    ASSERT_TRUE(e) << bad;
    EXPECT_EQ(e->status, 415);
    EXPECT_NE(e->message.find(bad), std::string::npos) << e->message;
    EXPECT_NE(e->message.find("application/json"), std::string::npos);
  }
}

TEST(ServerSchemaTest, AbortIsNoFinishReasonOnTheWire) {
  EXPECT_EQ(finish_reason_json(FinishReason::kAbort), "length");
  EXPECT_EQ(finish_reason_json(FinishReason::kStop), "stop");
  EXPECT_TRUE(finish_reason_json(FinishReason::kNone).is_null());
}

TEST(ServerSchemaTest, ParsesPromptForms) {
  OpenAiRequest a, b, c;
  EXPECT_FALSE(parse_openai_request(R"({"prompt":["x","y"],"logprobs":1})", Endpoint::kCompletions, &a));
  EXPECT_EQ(a.text_prompts.size(), 2u);
  EXPECT_EQ(a.top_logprobs, 1);
  EXPECT_FALSE(parse_openai_request(R"({"prompt":[1,2,3]})", Endpoint::kCompletions, &b));
  EXPECT_EQ(b.token_prompts, (std::vector<std::vector<int32_t>>{{1, 2, 3}}));
  EXPECT_FALSE(parse_openai_request(R"({"prompt":[[1],[2,3]]})", Endpoint::kCompletions, &c));
  EXPECT_EQ(c.num_prompts(), 2);
}

TEST(ServerSchemaTest, RejectsBadInput) {
  struct Case {
    const char* body;
    Endpoint ep;
    const char* param;
  };
  const Case cases[] = {
      {"{", Endpoint::kChat, ""},
      {R"({"messages":[]})", Endpoint::kChat, "messages"},
      {R"({"messages":[{"role":"wizard","content":"x"}]})", Endpoint::kChat, "messages[0].role"},
      {R"({"messages":[{"role":"user","content":5}]})", Endpoint::kChat, "messages[0].content"},
      {R"({"prompt":"x","max_tokens":0})", Endpoint::kCompletions, "max_tokens"},
      {R"({"prompt":"x","max_tokens":1.5})", Endpoint::kCompletions, "max_tokens"},
      {R"({"prompt":"x","top_p":0})", Endpoint::kCompletions, "top_p"},
      {R"({"prompt":"x","logprobs":true})", Endpoint::kCompletions, "logprobs"},
      {R"({"prompt":[-1]})", Endpoint::kCompletions, "prompt"},
      {R"({"prompt":"x","stop":["a","b","c","d","e","f","g","h","i","j","k","l","m","n","o","p","q"]})",
       Endpoint::kCompletions, "stop"},
      {R"({"prompt":"x","stream_options":1})", Endpoint::kCompletions, "stream_options"},
  };
  for (const Case& c : cases) {
    OpenAiRequest r;
    auto e = parse_openai_request(c.body, c.ep, &r);
    ASSERT_TRUE(e) << c.body;
    EXPECT_EQ(e->status, 400) << c.body;
    EXPECT_EQ(e->param, c.param) << c.body << " -> " << e->message;
    const auto j = e->to_json();
    EXPECT_TRUE(j["error"].contains("message") && j["error"].contains("type") && j["error"].contains("code"));
  }
  OpenAiRequest r;
  auto e = parse_openai_request(std::string("{\"prompt\":\"\xff\"}"), Endpoint::kCompletions, &r);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code, "invalid_utf8");
}

TEST(ServerMetricsTest, RendersPrometheusText) {
  MetricsRegistry reg(std::vector<std::pair<std::string, std::string>>{{"model_name", "a\"b"}});
  reg.counter("x_total", "an x").inc(3);
  reg.gauge("y_ratio", "a y").set(0.25);
  Histogram& h = reg.histogram("z_seconds", "a z", {0.1, 1});
  h.observe(0.05);
  h.observe(0.5);
  h.observe(5);
  const std::string t = reg.render();
  EXPECT_NE(t.find("# TYPE x_total counter\nx_total{model_name=\"a\\\"b\"} 3\n"), std::string::npos) << t;
  EXPECT_NE(t.find("y_ratio{model_name=\"a\\\"b\"} 0.25\n"), std::string::npos) << t;
  EXPECT_NE(t.find("z_seconds_bucket{model_name=\"a\\\"b\",le=\"0.1\"} 1\n"), std::string::npos) << t;
  EXPECT_NE(t.find("z_seconds_bucket{model_name=\"a\\\"b\",le=\"1\"} 2\n"), std::string::npos) << t;
  EXPECT_NE(t.find("z_seconds_bucket{model_name=\"a\\\"b\",le=\"+Inf\"} 3\n"), std::string::npos) << t;
  EXPECT_NE(t.find("z_seconds_count{model_name=\"a\\\"b\"} 3\n"), std::string::npos) << t;
  EXPECT_NE(t.find("z_seconds_sum{model_name=\"a\\\"b\"} 5.55\n"), std::string::npos) << t;
}

TEST(ServerSseTest, Framing) {
  EXPECT_EQ(sse_event(nlohmann::json{{"a", 1}}), "data: {\"a\":1}\n\n");
  EXPECT_EQ(sse_done(), "data: [DONE]\n\n");
  EXPECT_EQ(sse_comment("x"), ": x\n\n");
}

}  // namespace
}  // namespace strata
