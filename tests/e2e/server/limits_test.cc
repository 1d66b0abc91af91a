// Requests never shrink in silence: on a server whose KV pool (256 tokens) is smaller than the
// model's context (4096), /v1/models reports the 256 the server enforces, a prompt + max_tokens
// that can never fit is a 400 naming the pool and the flag, and one that fits gets every token.
// At shutdown, a drained request that had started ends with an OpenAI finish_reason and one that
// had not started gets a 503. Plus the small protocol items (Content-Type, a bare POST).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "server_process.h"

namespace strata::e2e {
namespace {

using nlohmann::json;

TEST(ServeLimitsTest, PoolSmallerThanContextIsEnforcedAndReported) {
  ServerProcess server;
  ASSERT_TRUE(server.start({"--max-total-tokens", "256"})) << server.log();
  json models = json::parse(http(server.port(), "GET", "/v1/models").body);
  EXPECT_EQ(models["data"][0]["max_model_len"], 256);
  json info = json::parse(http(server.port(), "GET", "/get_server_info").body);
  EXPECT_EQ(info["max_model_len"], 256);
  EXPECT_EQ(info["context_length"], 4096);  // the model's own

  HttpResponse r =
      http(server.port(), "POST", "/v1/completions", R"({"prompt":"hi","max_tokens":4000})");
  EXPECT_EQ(r.status, 400) << r.body;
  json e = json::parse(r.body)["error"];
  EXPECT_EQ(e["code"], "context_length_exceeded");
  EXPECT_EQ(e["param"], "max_tokens");
  const std::string msg = e["message"];
  EXPECT_NE(msg.find("maximum context length is 256 tokens"), std::string::npos) << msg;
  EXPECT_NE(msg.find("KV cache pool holds 256 tokens"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--max-total-tokens"), std::string::npos) << msg;
  r = http(server.port(), "POST", "/v1/chat/completions",
           R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":300})");
  EXPECT_EQ(r.status, 400) << r.body;

  // What fits runs to the end: every token asked for, never a silent cut.
  r = http(server.port(), "POST", "/v1/completions",
           R"({"prompt":"hi","max_tokens":250,"ignore_eos":true})", 300);
  ASSERT_EQ(r.status, 200) << r.body;
  json j = json::parse(r.body);
  EXPECT_EQ(j["usage"]["completion_tokens"], 250);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(server.stop(), 0) << server.log();
}

// /health is liveness (no generation); /health_generate runs a probe when idle, which is not
// counted as traffic in /metrics.
TEST(ServeLimitsTest, LivenessAndReadinessAreSeparateAndProbesAreNotTraffic) {
  ServerProcess server;
  ASSERT_TRUE(server.start({"--health-timeout", "45"})) << server.log();
  EXPECT_EQ(http(server.port(), "GET", "/health").status, 200);
  EXPECT_EQ(http(server.port(), "GET", "/health_generate").status, 200);
  const std::string m = http(server.port(), "GET", "/metrics").body;
  EXPECT_EQ(metric_value(m, "strata_requests_finished_total"), 0) << m;
  EXPECT_EQ(metric_value(m, "strata_generation_tokens_total"), 0) << m;
  EXPECT_EQ(
      json::parse(http(server.port(), "GET", "/get_server_info").body)["flags"]["--health-timeout"],
      "45");
  EXPECT_EQ(server.stop(), 0) << server.log();
}

TEST(ServeLimitsTest, JsonContentTypeAndBodylessPosts) {
  ServerProcess server;
  ASSERT_TRUE(server.start({})) << server.log();
  HttpConn c;
  ASSERT_TRUE(c.connect(server.port()));
  ASSERT_TRUE(
      c.send_request("POST", "/v1/completions", R"({"prompt":"hi","max_tokens":2})", "text/plain"));
  HttpResponse r = c.read_response(std::chrono::steady_clock::now() + std::chrono::seconds(30));
  EXPECT_EQ(r.status, 415) << r.body;
  EXPECT_EQ(json::parse(r.body)["error"]["code"], "unsupported_media_type");
  // `curl -X POST /flush_cache`: no body, no Content-Length.
  HttpConn f;
  ASSERT_TRUE(f.connect(server.port()));
  const std::string bare =
      "POST /flush_cache HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
  ASSERT_EQ(::send(f.fd(), bare.data(), bare.size(), MSG_NOSIGNAL), ssize_t(bare.size()));
  r = f.read_response(std::chrono::steady_clock::now() + std::chrono::seconds(30));
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(server.stop(), 0) << server.log();
}

// One slot: a long stream runs, a second request waits. SIGTERM with a 2 s drain: the stream ends
// with finish_reason "length" (not "abort", which no OpenAI client knows) and [DONE]; the waiting
// request, which never started, gets 503 with Retry-After.
TEST(ServeLimitsTest, DrainEndsStartedRequestsWithLengthAndUnstartedWith503) {
  ServerProcess server;
  ASSERT_TRUE(server.start({"--max-running-requests", "1", "--drain-timeout", "2"}))
      << server.log();
  HttpConn running, waiting;
  ASSERT_TRUE(running.connect(server.port()) && waiting.connect(server.port()));
  ASSERT_TRUE(running.send_request(
      "POST", "/v1/completions",
      R"({"prompt":"The kernel","max_tokens":3900,"ignore_eos":true,"stream":true})"));
  ASSERT_TRUE(poll_until(
      [&] {
        running.read_some(50);
        return sse_data(running.raw()).size() >= 3;
      },
      60));
  ASSERT_TRUE(waiting.send_request("POST", "/v1/completions", R"({"prompt":"hi","max_tokens":8})"));
  ASSERT_TRUE(poll_until(
      [&] {
        return metric_value(http(server.port(), "GET", "/metrics").body,
                            "strata_num_queued_requests") == 1;
      },
      30));
  server.signal(SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  HttpResponse rr = running.read_response(deadline), rw = waiting.read_response(deadline);
  EXPECT_EQ(rr.status, 200);
  EXPECT_NE(rr.body.find(R"("finish_reason":"length")"), std::string::npos)
      << rr.body.substr(rr.body.size() - 300);
  EXPECT_EQ(rr.body.find(R"("finish_reason":"abort")"), std::string::npos);
  EXPECT_NE(rr.body.find("data: [DONE]"), std::string::npos);
  EXPECT_EQ(rw.status, 503) << rw.body;
  EXPECT_EQ(rw.headers["retry-after"], "1");
  EXPECT_NE(rw.body.find("had not started"), std::string::npos) << rw.body;
  ASSERT_TRUE(poll_until([&] { return server.exited(); }, 60)) << server.log();
  EXPECT_EQ(server.exit_code(), 0) << server.log();
}

}  // namespace
}  // namespace strata::e2e
