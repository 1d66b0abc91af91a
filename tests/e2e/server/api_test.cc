// strata serve end to end: endpoints, OpenAI response shapes, and one test per kind of bad input
// (status code and message). One server for the whole suite.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "server_process.h"

namespace strata::e2e {
namespace {

using nlohmann::json;

class ServeApiTest : public ::testing::Test {
 protected:
  // No ASSERT here: a fatal failure in SetUpTestSuite makes gtest report every test as skipped,
  // which ctest counts as a pass. Each test asserts the start instead (SetUp), so it fails.
  static void SetUpTestSuite() {
    server_ = new ServerProcess();
    started_ = server_->start({"--max-total-tokens", "8192", "--max-request-body-mb", "1"});
  }
  void SetUp() override {
    ASSERT_TRUE(started_) << "the server did not start:\n" << server_->log();
  }
  static void TearDownTestSuite() {
    EXPECT_EQ(server_->stop(), 0) << server_->log();
    delete server_;
  }
  static HttpResponse post(const std::string& path, const std::string& body) {
    return http(server_->port(), "POST", path, body);
  }
  // Posts `body` and checks an OpenAI-shaped error with `status` whose message contains `needle`.
  static json expect_error(const std::string& path, const std::string& body, int status,
                           const std::string& needle, const char* param = nullptr) {
    HttpResponse r = post(path, body);
    EXPECT_EQ(r.status, status) << r.body;
    json j = json::parse(r.body, nullptr, false);
    EXPECT_TRUE(j.is_object() && j.contains("error")) << r.body;
    if (!j.is_object() || !j.contains("error")) return j;
    const json& e = j["error"];
    EXPECT_TRUE(e.contains("message") && e.contains("type") && e.contains("param") &&
                e.contains("code"))
        << r.body;
    EXPECT_NE(e["message"].get<std::string>().find(needle), std::string::npos) << r.body;
    if (param) {
      EXPECT_EQ(e["param"], param) << r.body;
    }
    return j;
  }
  static ServerProcess* server_;
  static bool started_;
};
ServerProcess* ServeApiTest::server_ = nullptr;
bool ServeApiTest::started_ = false;

TEST_F(ServeApiTest, ModelsAndInfo) {
  HttpResponse r = http(server_->port(), "GET", "/v1/models");
  ASSERT_EQ(r.status, 200);
  json j = json::parse(r.body);
  EXPECT_EQ(j["object"], "list");
  ASSERT_EQ(j["data"].size(), 1u);
  EXPECT_EQ(j["data"][0]["id"], "house-llama");  // basename of --model-path
  EXPECT_EQ(http(server_->port(), "GET", "/v1/models/house-llama").status, 200);
  EXPECT_EQ(http(server_->port(), "GET", "/v1/models/nope").status, 404);

  r = http(server_->port(), "GET", "/get_server_info");
  ASSERT_EQ(r.status, 200);
  j = json::parse(r.body);
  EXPECT_EQ(j["kv_capacity_tokens"], 8192);  // --max-total-tokens caps the pool
  EXPECT_EQ(j["context_length"], 4096);
  EXPECT_EQ(j["served_model_name"], "house-llama");
  EXPECT_EQ(j["flags"]["--max-total-tokens"], "8192");
  EXPECT_GT(j["max_running_requests"].get<int>(), 0);
}

TEST_F(ServeApiTest, HealthAndFlush) {
  EXPECT_EQ(http(server_->port(), "GET", "/health").status, 200);
  HttpResponse r = post("/flush_cache", "");
  EXPECT_EQ(r.status, 200) << r.body;
}

TEST_F(ServeApiTest, CompletionShape) {
  HttpResponse r = post(
      "/v1/completions",
      R"({"model":"house-llama","prompt":"The kernel","max_tokens":5,"temperature":0,"logprobs":2})");
  ASSERT_EQ(r.status, 200) << r.body;
  json j = json::parse(r.body);
  EXPECT_EQ(j["object"], "text_completion");
  ASSERT_EQ(j["choices"].size(), 1u);
  const json& c = j["choices"][0];
  EXPECT_EQ(c["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["completion_tokens"], 5);
  EXPECT_GT(j["usage"]["prompt_tokens"].get<int>(), 0);
  ASSERT_EQ(c["logprobs"]["tokens"].size(), 5u);
  ASSERT_EQ(c["logprobs"]["top_logprobs"][0].size(), 2u);
  // Greedy: the chosen token is the most likely one.
  const double chosen = c["logprobs"]["token_logprobs"][0];
  for (auto& [tok, lp] : c["logprobs"]["top_logprobs"][0].items())
    EXPECT_LE(lp.get<double>(), chosen + 1e-5);
}

TEST_F(ServeApiTest, ChatStreamShape) {
  HttpResponse r =
      post("/v1/chat/completions",
           R"({"messages":[{"role":"user","content":"What is a kernel?"}],"max_tokens":6,
                            "temperature":0,"stream":true,"stream_options":{"include_usage":true},"n":2})");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_TRUE(r.complete);
  EXPECT_EQ(r.headers["content-type"].rfind("text/event-stream", 0), 0u);
  auto events = sse_data(r.body);
  ASSERT_GE(events.size(), 4u);
  EXPECT_EQ(events.back(), "[DONE]");
  json usage = json::parse(events[events.size() - 2]);
  EXPECT_EQ(usage["usage"]["completion_tokens"], 12);
  std::string text[2];
  int finished = 0;
  for (size_t i = 0; i + 2 < events.size(); ++i) {
    json e = json::parse(events[i]);
    EXPECT_EQ(e["object"], "chat.completion.chunk");
    const json& c = e["choices"][0];
    const int idx = c["index"];
    if (c["delta"].contains("content")) text[idx] += c["delta"]["content"].get<std::string>();
    if (!c["finish_reason"].is_null()) ++finished;
  }
  EXPECT_EQ(finished, 2);
  EXPECT_EQ(text[0], text[1]);  // greedy: both choices agree
  EXPECT_FALSE(text[0].empty());
}

TEST_F(ServeApiTest, StopString) {
  HttpResponse r =
      post("/v1/completions", R"({"prompt":"The kernel","max_tokens":40,"temperature":0})");
  ASSERT_EQ(r.status, 200);
  const std::string full = json::parse(r.body)["choices"][0]["text"];
  ASSERT_GT(full.size(), 6u);
  const std::string stop = full.substr(4, 2);
  r = post("/v1/completions",
           json{{"prompt", "The kernel"}, {"max_tokens", 40}, {"temperature", 0}, {"stop", {stop}}}
               .dump());
  ASSERT_EQ(r.status, 200);
  json c = json::parse(r.body)["choices"][0];
  EXPECT_EQ(c["finish_reason"], "stop");
  EXPECT_EQ(c["text"], full.substr(0, full.find(stop)));
}

TEST_F(ServeApiTest, MalformedJson) {
  expect_error("/v1/chat/completions", R"({"messages": [)", 400, "not valid JSON");
  expect_error("/v1/completions", R"([1, 2])", 400, "must be a JSON object");
}

TEST_F(ServeApiTest, BodyOverTheLimit) {  // the suite's server runs with --max-request-body-mb 1
  const std::string big =
      json{{"prompt", std::string(size_t(1) << 20, 'a')}, {"max_tokens", 1}}.dump();
  expect_error("/v1/completions", big, 413, "limit of 1 MiB (--max-request-body-mb)");
}

TEST_F(ServeApiTest, WrongFieldTypes) {
  expect_error("/v1/completions", R"({"prompt":"hi","temperature":"hot"})", 400, "must be a number",
               "temperature");
  expect_error("/v1/completions", R"({"prompt":"hi","max_tokens":"8"})", 400, "must be an integer",
               "max_tokens");
  expect_error("/v1/completions", R"({"prompt":42})", 400, "'prompt' must be", "prompt");
  expect_error("/v1/chat/completions", R"({"messages":"hello"})", 400, "must be an array",
               "messages");
  expect_error("/v1/chat/completions",
               R"({"messages":[{"role":"user","content":"hi"}],"stream":"yes"})", 400,
               "must be a boolean", "stream");
  expect_error("/v1/completions", R"({"prompt":"hi","stop":[1]})", 400, "'stop' must be", "stop");
  expect_error("/v1/completions", R"({"prompt":"hi","n":0})", 400, "'n' must be between", "n");
  expect_error("/v1/completions", R"({"prompt":"hi","temperature":3})", 400, "between 0 and 2",
               "temperature");
  expect_error("/v1/chat/completions",
               R"({"messages":[{"role":"user","content":"hi"}],"top_logprobs":3})", 400,
               "requires 'logprobs'", "top_logprobs");
}

TEST_F(ServeApiTest, UnknownModel) {
  json j = expect_error("/v1/completions", R"({"model":"gpt-4","prompt":"hi"})", 404,
                        "does not exist", "model");
  EXPECT_EQ(j["error"]["code"], "model_not_found");
}

TEST_F(ServeApiTest, EmptyMessages) {
  expect_error("/v1/chat/completions", R"({"messages":[]})", 400, "at least one message",
               "messages");
  expect_error("/v1/chat/completions", R"({"model":"house-llama"})", 400, "'messages' is required",
               "messages");
  expect_error("/v1/completions", R"({"prompt":""})", 400, "must not be empty", "prompt");
}

TEST_F(ServeApiTest, PromptLongerThanContext) {
  std::string prompt;
  for (int i = 0; i < 5000; ++i) prompt += "kernel ";
  json j = expect_error("/v1/completions", json{{"prompt", prompt}}.dump(), 400,
                        "maximum context length", "prompt");
  EXPECT_EQ(j["error"]["code"], "context_length_exceeded");
  expect_error("/v1/chat/completions",
               json{{"messages", {{{"role", "user"}, {"content", prompt}}}}}.dump(), 400,
               "maximum context length", "messages");
}

TEST_F(ServeApiTest, MaxTokensBeyondContext) {
  json j = expect_error("/v1/completions", R"({"prompt":"hi","max_tokens":5000})", 400,
                        "maximum context length", "max_tokens");
  EXPECT_EQ(j["error"]["code"], "context_length_exceeded");
  expect_error("/v1/chat/completions",
               R"({"messages":[{"role":"user","content":"hi"}],"max_completion_tokens":4096})", 400,
               "maximum context length", "max_tokens");
}

TEST_F(ServeApiTest, InvalidUtf8) {
  const std::string body = std::string(R"({"prompt":"caf)") + "\xC3\x28" + R"(","max_tokens":2})";
  json j = expect_error("/v1/completions", body, 400, "not valid UTF-8");
  EXPECT_EQ(j["error"]["code"], "invalid_utf8");
}

TEST_F(ServeApiTest, UnknownEndpointAndUnsupported) {
  HttpResponse r = http(server_->port(), "GET", "/v1/nothing");
  EXPECT_EQ(r.status, 404);
  EXPECT_NE(r.body.find("unknown endpoint"), std::string::npos) << r.body;
  json j = expect_error("/v1/completions", R"({"prompt":"hi","regex":"a+"})", 400, "not supported",
                        "regex");
  EXPECT_EQ(j["error"]["code"], "unsupported_parameter");
  // Token ids are checked against the model's vocabulary, naming the field.
  expect_error("/v1/completions", R"({"prompt":"hi","logit_bias":{"99999999":1}})", 400,
               "outside the vocabulary", "logit_bias");
  expect_error("/v1/completions", R"({"prompt":[1, 99999999]})", 400, "outside the vocabulary",
               "prompt");
}

// SGLang's sampling fields on the OpenAI request take effect: a logit_bias of +100 makes its token
// the only one sampled, a stop token id ends the completion, and the penalties, min_p, top_k and
// a seed are accepted (their behaviour: tests/unit/engine/logit_edits_test.cc,
// tests/golden/engine).
TEST_F(ServeApiTest, SglangSamplingFieldsTakeEffect) {
  json forced =
      json::parse(post("/v1/completions", R"({"prompt":"The kernel","max_tokens":4,"temperature":1,
      "seed":3,"logit_bias":{"1000":100},"logprobs":0,"ignore_eos":true})")
                      .body);
  ASSERT_TRUE(forced.contains("choices")) << forced.dump();
  const json& tokens = forced["choices"][0]["logprobs"]["tokens"];
  ASSERT_EQ(tokens.size(), 4u) << forced.dump();
  for (const json& t : tokens) EXPECT_EQ(t, tokens[0]) << forced.dump();
  // The same token as a stop token: the completion ends at its first appearance.
  json stopped =
      json::parse(post("/v1/completions", R"({"prompt":"The kernel","max_tokens":4,"temperature":0,
      "logit_bias":{"1000":100},"stop_token_ids":[1000]})")
                      .body);
  EXPECT_EQ(stopped["choices"][0]["finish_reason"], "stop") << stopped.dump();
  EXPECT_EQ(stopped["usage"]["completion_tokens"], 1) << stopped.dump();
  // A special token (<|im_start|>, id 1) forced: left out of the text by default, written with
  // skip_special_tokens false.
  for (bool skip : {true, false}) {
    json special = json::parse(post("/v1/completions", json({{"prompt", "The kernel"},
                                                             {"max_tokens", 3},
                                                             {"temperature", 0},
                                                             {"logit_bias", {{"1", 100}}},
                                                             {"skip_special_tokens", skip}})
                                                           .dump())
                                   .body);
    EXPECT_EQ(special["usage"]["completion_tokens"], 3) << special.dump();
    EXPECT_EQ(special["choices"][0]["text"], skip ? "" : "<|im_start|><|im_start|><|im_start|>")
        << special.dump();
  }
  HttpResponse r =
      post("/v1/chat/completions", R"({"messages":[{"role":"user","content":"Name a colour."}],
      "max_tokens":6,"temperature":0.8,"top_k":40,"min_p":0.05,"repetition_penalty":1.2,"presence_penalty":0.5,
      "frequency_penalty":0.3,"seed":11,"chat_template_kwargs":{"enable_thinking":false}})");
  ASSERT_EQ(r.status, 200) << r.body;
  // Seeded: the same request gives the same text.
  HttpResponse again =
      post("/v1/chat/completions", R"({"messages":[{"role":"user","content":"Name a colour."}],
      "max_tokens":6,"temperature":0.8,"top_k":40,"min_p":0.05,"repetition_penalty":1.2,"presence_penalty":0.5,
      "frequency_penalty":0.3,"seed":11,"chat_template_kwargs":{"enable_thinking":false}})");
  ASSERT_EQ(again.status, 200) << again.body;
  EXPECT_EQ(json::parse(r.body)["choices"][0]["message"]["content"],
            json::parse(again.body)["choices"][0]["message"]["content"]);
}

TEST_F(ServeApiTest, MetricsPassPromtool) {
  // Some traffic first so the histograms have samples.
  ASSERT_EQ(post("/v1/completions", R"({"prompt":"The","max_tokens":3})").status, 200);
  HttpResponse r = http(server_->port(), "GET", "/metrics");
  ASSERT_EQ(r.status, 200);
  for (const char* name :
       {"strata_num_running_requests", "strata_num_queued_requests", "strata_kv_cache_used_tokens",
        "strata_prefix_cache_hit_ratio", "strata_prompt_tokens_total",
        "strata_generation_tokens_total", "strata_time_to_first_token_seconds_count",
        "strata_inter_token_latency_seconds_count",
        "strata_generation_throughput_tokens_per_second"})
    EXPECT_GE(metric_value(r.body, name), 0) << name;
  EXPECT_GT(metric_value(r.body, "strata_time_to_first_token_seconds_count"), 0);
  std::string out;
  if (run_command("command -v promtool", &out) != 0)
    GTEST_SKIP() << "promtool not installed (Debian package prometheus)";
  const std::string path = ::testing::TempDir() + "strata_metrics.txt";
  {
    std::ofstream f(path);
    f << r.body;
  }
  EXPECT_EQ(run_command("promtool check metrics < " + path, &out), 0) << out;
}

}  // namespace
}  // namespace strata::e2e
