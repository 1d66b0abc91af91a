// The prompt's logprobs through the real server: /v1/completions with echo and logprobs (what
// lm-evaluation-harness's loglikelihood requests send: max_tokens 0) against the Hugging Face
// logits of every position in ../shared/fixtures/house-llama, streamed and whole alike; echo
// with a completion after the prompt; and SGLang's /generate logprob_start_len giving the same
// numbers as input_token_logprobs. The engine side is tests/golden/engine/
// engine_prompt_logprobs_test, the wire shapes tests/unit/server/.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "server_process.h"
#include "support/golden.h"

namespace strata::e2e {
namespace {

using nlohmann::json;

// log p(ids[pos] | ids[:pos]) from the reference logits of seq0, row pos - 1.
double reference_logprob(const std::vector<float>& logits, int64_t vocab, size_t pos, int32_t id) {
  return testing::log_softmax(logits.data() + (pos - 1) * size_t(vocab), vocab)[size_t(id)];
}

TEST(ServePromptLogprobsTest, EchoAndLogprobStartLenMatchTheReference) {
  const testing::Reference ref(std::string(STRATA_SHARED_DIR) +
                               "/fixtures/house-llama/reference.safetensors");
  ASSERT_TRUE(ref.ok());
  const std::vector<int32_t> ids = ref.i32("seq0.input_ids");
  const std::vector<float> logits = ref.f32("seq0.logits");
  const int64_t vocab = int64_t(logits.size() / ids.size());
  ServerProcess server;
  ASSERT_TRUE(server.start({"--chunked-prefill-size", "8", "--page-size", "4"})) << server.log();
  const int port = server.port();

  // lm-evaluation-harness's loglikelihood request: the prompt alone, its tokens' logprobs.
  const json body = {
      {"prompt", ids}, {"echo", true}, {"logprobs", 1}, {"max_tokens", 0}, {"temperature", 0}};
  const json r = post_json(port, "/v1/completions", body);
  ASSERT_TRUE(r.contains("choices")) << r;
  const json& choice = r["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "length") << r;
  EXPECT_EQ(r["usage"]["completion_tokens"], 0) << r;
  EXPECT_EQ(r["usage"]["prompt_tokens"], ids.size()) << r;
  const json& lp = choice["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), ids.size()) << r;
  ASSERT_EQ(lp["token_logprobs"].size(), ids.size()) << r;
  EXPECT_TRUE(lp["token_logprobs"][0].is_null()) << r;
  EXPECT_TRUE(lp["top_logprobs"][0].is_null()) << r;
  double worst = 0;
  std::string joined;
  for (size_t pos = 1; pos < ids.size(); ++pos) {
    const double got = lp["token_logprobs"][pos].get<double>();
    const double want = reference_logprob(logits, vocab, pos, ids[pos]);
    worst = std::max(worst, std::abs(got - want));
    EXPECT_NEAR(got, want, 1e-4) << "position " << pos;
    EXPECT_EQ(lp["top_logprobs"][pos].size(), 1u) << "position " << pos;
  }
  for (const auto& t : lp["tokens"]) joined += t.get<std::string>();
  EXPECT_EQ(choice["text"], joined);  // the text is the prompt's (house-llama: no leading space)
  std::printf("echo: %zu prompt logprobs, max |error| %.2g against the HF logits\n", ids.size() - 1,
              worst);

  // Streamed: the prompt's chunk, then the end; the same numbers.
  json stream_body = body;
  stream_body["stream"] = true;
  const HttpResponse s = http(port, "POST", "/v1/completions", stream_body.dump());
  ASSERT_EQ(s.status, 200) << s.body;
  const std::vector<std::string> events = sse_data(s.body);
  ASSERT_GE(events.size(), 3u) << s.body;
  const json first = json::parse(events[0])["choices"][0];
  EXPECT_EQ(first["text"], choice["text"]);
  EXPECT_EQ(first["logprobs"]["token_logprobs"], lp["token_logprobs"]);
  EXPECT_EQ(json::parse(events[events.size() - 2])["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(events.back(), "[DONE]");

  // echo before a completion: the prompt's text and tokens, then the 3 new ones.
  json more = body;
  more["max_tokens"] = 3;
  const json m = post_json(port, "/v1/completions", more);
  const json& mc = m["choices"][0];
  EXPECT_EQ(m["usage"]["completion_tokens"], 3) << m;
  ASSERT_EQ(mc["logprobs"]["tokens"].size(), ids.size() + 3) << m;
  EXPECT_EQ(mc["text"].get<std::string>().rfind(choice["text"].get<std::string>(), 0), 0u) << m;
  for (size_t pos = 0; pos < ids.size(); ++pos)
    EXPECT_EQ(mc["logprobs"]["token_logprobs"][pos], lp["token_logprobs"][pos]) << pos;
  // Without echo the same request's text is the completion alone.
  json plain = more;
  plain.erase("echo");
  const json pl = post_json(port, "/v1/completions", plain);
  EXPECT_EQ(choice["text"].get<std::string>() + pl["choices"][0]["text"].get<std::string>(),
            mc["text"])
      << pl;

  // lm-evaluation-harness's batch: token-id prompts in a list, max_tokens 1, a seed; choice i is
  // prompt i's, its tokens the prompt's and the one generated.
  const std::vector<int32_t> ids1 = ref.i32("seq1.input_ids");
  const json batch = post_json(port, "/v1/completions",
                               {{"prompt", {ids, ids1}},
                                {"echo", true},
                                {"logprobs", 1},
                                {"max_tokens", 1},
                                {"temperature", 0},
                                {"seed", 1234}});
  ASSERT_EQ(batch["choices"].size(), 2u) << batch;
  for (int i = 0; i < 2; ++i) {
    const json& bc = batch["choices"][i];
    EXPECT_EQ(bc["index"], i);
    const size_t n = (i == 0 ? ids : ids1).size();
    ASSERT_EQ(bc["logprobs"]["token_logprobs"].size(), n + 1) << bc;
    if (i != 0) continue;
    for (size_t pos = 0; pos < n; ++pos)
      EXPECT_EQ(bc["logprobs"]["token_logprobs"][pos], lp["token_logprobs"][pos]) << pos;
  }

  // SGLang's /generate: input_token_logprobs from logprob_start_len, the same numbers.
  const json g = post_json(port, "/generate",
                           {{"input_ids", ids},
                            {"return_logprob", true},
                            {"logprob_start_len", 4},
                            {"sampling_params", {{"max_new_tokens", 1}, {"temperature", 0}}}});
  const json& in = g["meta_info"]["input_token_logprobs"];
  ASSERT_EQ(in.size(), ids.size() - 4) << g;
  for (size_t pos = 4; pos < ids.size(); ++pos) {
    EXPECT_EQ(in[pos - 4][1], ids[pos]);
    EXPECT_NEAR(in[pos - 4][0].get<double>(), lp["token_logprobs"][pos].get<double>(), 1e-6);
  }
  // max_new_tokens 0 (SGLang's frontend scoring choices): the prompt's logprobs, no output.
  const json z = post_json(port, "/generate",
                           {{"input_ids", ids},
                            {"return_logprob", true},
                            {"logprob_start_len", 0},
                            {"sampling_params", {{"max_new_tokens", 0}}}});
  EXPECT_EQ(z["text"], "") << z;
  EXPECT_EQ(z["output_ids"].size(), 0u) << z;
  EXPECT_EQ(z["meta_info"]["finish_reason"], json({{"type", "length"}, {"length", 0}})) << z;
  ASSERT_EQ(z["meta_info"]["input_token_logprobs"].size(), ids.size()) << z;
  EXPECT_TRUE(z["meta_info"]["input_token_logprobs"][0][0].is_null()) << z;
  EXPECT_EQ(z["meta_info"]["input_token_logprobs"][5][0], in[1][0]) << z;

  // Chat has no echo.
  const HttpResponse chat =
      http(port, "POST", "/v1/chat/completions",
           json{{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"echo", true}}.dump());
  EXPECT_EQ(chat.status, 400) << chat.body;
  EXPECT_NE(chat.body.find("unsupported_parameter"), std::string::npos) << chat.body;
}

}  // namespace
}  // namespace strata::e2e
