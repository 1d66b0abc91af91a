// SGLang's native /generate through the real server: the same greedy text as /v1/completions for
// text, token-id and batched prompts, SGLang's response shape, the stream whose events carry the
// whole text so far (what SGLang's bench_serving reads, with the payload it sends), and errors in
// the native field names; min_new_tokens. The translation itself is
// tests/unit/server/sglang_generate_test.
#include <gtest/gtest.h>

#include <chrono>
#include <nlohmann/json.hpp>

#include "server_process.h"

namespace strata::e2e {
namespace {

using nlohmann::json;

const char* kPrompts[] = {"The Linux kernel", "A dictionary is"};

std::string completion(int port, const json& prompt, int max_tokens) {
  const json r = post_json(port, "/v1/completions",
                           {{"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}});
  return r["choices"][0]["text"];
}

TEST(ServeSglangGenerateTest, NativeApiMatchesCompletions) {
  ServerProcess server;
  ASSERT_TRUE(server.start({})) << server.log();
  const int port = server.port();
  const json greedy = {{"max_new_tokens", 12}, {"temperature", 0}};

  const json one =
      post_json(port, "/generate", {{"text", kPrompts[0]}, {"sampling_params", greedy}});
  ASSERT_TRUE(one.is_object()) << one;
  EXPECT_EQ(one["text"], completion(port, kPrompts[0], 12)) << one;
  EXPECT_EQ(one["output_ids"].size(), 12u) << one;
  EXPECT_EQ(one["meta_info"]["finish_reason"], json({{"type", "length"}, {"length", 12}})) << one;
  EXPECT_EQ(one["meta_info"]["completion_tokens"], 12) << one;
  EXPECT_GT(one["meta_info"]["prompt_tokens"].get<int>(), 0) << one;
  EXPECT_FALSE(one["meta_info"]["id"].get<std::string>().empty()) << one;

  // Token ids in, and a batch: a list back, each item as its prompt alone would answer.
  const json ids = one["output_ids"];
  const json by_ids =
      post_json(port, "/generate", {{"input_ids", ids}, {"sampling_params", greedy}});
  EXPECT_EQ(by_ids["text"], completion(port, ids, 12)) << by_ids;
  const json batch = post_json(
      port, "/generate",
      {{"text", {kPrompts[0], kPrompts[1]}}, {"rid", {"a", "b"}}, {"sampling_params", greedy}});
  ASSERT_TRUE(batch.is_array() && batch.size() == 2) << batch;
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(batch[i]["index"], i);
    EXPECT_EQ(batch[i]["text"], completion(port, kPrompts[i], 12)) << batch;
  }
  EXPECT_EQ(batch[0]["meta_info"]["id"], "a");
  EXPECT_EQ(batch[1]["meta_info"]["id"], "b");

  // The stream, with the payload SGLang's bench_serving (--backend sglang) sends: every event's
  // text is the whole text so far, completion_tokens counts up, finish_reason comes last.
  const json bench = {
      {"text", kPrompts[1]},
      {"sampling_params", {{"temperature", 0.0}, {"max_new_tokens", 12}, {"ignore_eos", true}}},
      {"stream", true},
      {"stream_options", {{"include_usage", true}}},
      {"lora_path", nullptr},
      {"return_logprob", false},
      {"logprob_start_len", -1}};
  const HttpResponse s = http(port, "POST", "/generate", bench.dump());
  ASSERT_EQ(s.status, 200) << s.body;
  const std::vector<std::string> events = sse_data(s.body);
  ASSERT_GE(events.size(), 3u) << s.body;
  EXPECT_EQ(events.back(), "[DONE]");
  std::string text;
  int tokens = 0, events_seen = 0;
  json last;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    last = json::parse(events[i]);
    const std::string t = last["text"];
    EXPECT_EQ(t.compare(0, text.size(), text), 0) << "event " << i << " does not extend the text";
    EXPECT_GE(last["meta_info"]["completion_tokens"].get<int>(), tokens);
    if (i + 2 < events.size()) EXPECT_TRUE(last["meta_info"]["finish_reason"].is_null());
    text = t;
    tokens = last["meta_info"]["completion_tokens"];
    ++events_seen;
  }
  EXPECT_GT(events_seen, 1) << s.body;  // streamed, not one event at the end
  EXPECT_EQ(text, completion(port, kPrompts[1], 12));
  EXPECT_EQ(tokens, 12);
  EXPECT_EQ(last["meta_info"]["finish_reason"]["type"], "length");

  // A prefill that takes seconds (3,500 tokens on the CPU): the keep-alives written meanwhile
  // must not break a reader that parses every non-empty line as JSON after "data: ", as
  // bench_serving does (an SSE comment would).
  json long_ids = json::array();
  for (int i = 0; i < 3500; ++i) long_ids.push_back(100 + (i * 7919) % 4000);
  const auto t0 = std::chrono::steady_clock::now();
  const HttpResponse slow = http(
      port, "POST", "/generate",
      json(
          {{"input_ids", long_ids}, {"sampling_params", {{"max_new_tokens", 4}}}, {"stream", true}})
          .dump());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(slow.status, 200) << slow.body;
  int parsed = 0;
  for (size_t start = 0, nl; (nl = slow.body.find('\n', start)) != std::string::npos;
       start = nl + 1) {
    const std::string line = slow.body.substr(start, nl - start);
    if (line.empty()) continue;
    ASSERT_TRUE(line.starts_with("data: ")) << line;
    if (line != "data: [DONE]")
      EXPECT_FALSE(json::parse(line.substr(6), nullptr, false).is_discarded()) << line;
    ++parsed;
  }
  EXPECT_GE(parsed, 2);
  if (seconds > 2)
    EXPECT_TRUE(slow.body.starts_with("\n\n")) << "no keep-alive in " << seconds << " s";

  // SGLang's internal state in /get_server_info: the throughput of the last busy second.
  const json server_info = json::parse(http(port, "GET", "/get_server_info", "").body);
  EXPECT_GT(server_info["internal_states"][0]["last_gen_throughput"].get<double>(), 0)
      << server_info;
  EXPECT_FALSE(server_info["internal_states"][0].contains("avg_spec_accept_length"));

  // SGLang's /get_model_info, which its tools probe.
  const HttpResponse info = http(port, "GET", "/get_model_info", "");
  ASSERT_EQ(info.status, 200) << info.body;
  const json mi = json::parse(info.body);
  EXPECT_EQ(mi["model_path"], house_llama()) << mi;
  EXPECT_FALSE(mi["tokenizer_path"].get<std::string>().empty()) << mi;
  EXPECT_EQ(mi["is_generation"], true) << mi;

  const HttpResponse bad =
      http(port, "POST", "/generate",
           json({{"text", "x"}, {"sampling_params", {{"temperature", 3}}}}).dump());
  EXPECT_EQ(bad.status, 400) << bad.body;
  EXPECT_EQ(json::parse(bad.body)["error"]["param"], "sampling_params.temperature") << bad.body;
  EXPECT_EQ(server.stop(), 0) << server.log();
}

// min_new_tokens (the completions' min_tokens): the stop token cannot end the output before it.
TEST(ServeSglangGenerateTest, MinNewTokensHoldsOffTheStopToken) {
  ServerProcess server;
  ASSERT_TRUE(server.start({})) << server.log();
  const int port = server.port();
  const json greedy = {{"max_new_tokens", 8}, {"temperature", 0}, {"ignore_eos", true}};
  const json plain =
      post_json(port, "/generate", {{"text", kPrompts[0]}, {"sampling_params", greedy}});
  ASSERT_EQ(plain["output_ids"].size(), 8u) << plain;
  const int first = plain["output_ids"][0];
  json stop = greedy;
  stop["stop_token_ids"] = {first};
  const json at_once =
      post_json(port, "/generate", {{"text", kPrompts[0]}, {"sampling_params", stop}});
  EXPECT_EQ(at_once["meta_info"]["completion_tokens"], 1) << at_once;
  EXPECT_EQ(at_once["meta_info"]["finish_reason"]["type"], "stop") << at_once;
  json held = stop;
  held["min_new_tokens"] = 4;
  const json later =
      post_json(port, "/generate", {{"text", kPrompts[0]}, {"sampling_params", held}});
  ASSERT_GE(later["output_ids"].size(), 4u) << later;
  for (int i = 0; i < 4; ++i) EXPECT_NE(later["output_ids"][i], first) << later;
  const json c = post_json(port, "/v1/completions",
                           {{"prompt", kPrompts[0]},
                            {"max_tokens", 8},
                            {"temperature", 0},
                            {"ignore_eos", true},
                            {"stop_token_ids", {first}},
                            {"min_tokens", 4}});
  EXPECT_EQ(c["choices"][0]["text"], later["text"]) << c;
  EXPECT_EQ(server.stop(), 0) << server.log();
}

}  // namespace
}  // namespace strata::e2e
