// SGLang's native /generate request and response (server/sglang_generate.h): the translation into
// the completions request it means (defaults, renamed fields, batches, rid), errors in the native
// names, refusals, and the response items (finish reasons, logprob triples).
#include "server/sglang_generate.h"

#include <gtest/gtest.h>

#include "bad_request_case.h"

namespace strata {
namespace {

TEST(SglangGenerate, TranslatesIntoTheCompletionsRequest) {
  OpenAiRequest r;
  auto e = parse_generate_request(
      R"({"text":"Once upon","rid":"r1","stream":true,"sampling_params":{"max_new_tokens":7,
          "temperature":0,"top_k":5,"sampling_seed":9,"stop":["\n"],"stop_token_ids":[3],
          "ignore_eos":true,"n":2,"spaces_between_special_tokens":true},
          "return_logprob":true,"top_logprobs_num":3,"logprob_start_len":-1,
          "return_text_in_logprobs":true})",
      &r);
  ASSERT_FALSE(e) << e->message;
  EXPECT_EQ(r.endpoint, Endpoint::kGenerate);
  EXPECT_EQ(r.text_prompts, std::vector<std::string>{"Once upon"});
  EXPECT_EQ(r.max_tokens, 7);
  EXPECT_EQ(r.sampling.temperature, 0.0f);
  EXPECT_EQ(r.sampling.top_k, 5);
  EXPECT_EQ(r.sampling.seed, 9u);
  EXPECT_EQ(r.sampling.stop_strings, std::vector<std::string>{"\n"});
  EXPECT_EQ(r.sampling.stop_token_ids, std::vector<int32_t>{3});
  EXPECT_TRUE(r.sampling.ignore_eos);
  EXPECT_EQ(r.n, 2);
  EXPECT_TRUE(r.stream);
  EXPECT_EQ(r.top_logprobs, 3);
  EXPECT_TRUE(r.text_in_logprobs);
  EXPECT_FALSE(r.native_batch);
  EXPECT_EQ(r.rids, std::vector<std::string>{"r1"});
  EXPECT_EQ(r.prompt_logprobs_from, -1);  // logprob_start_len -1: the output's logprobs only

  // logprob_start_len >= 0 asks for the prompt's from there, with return_logprob only.
  OpenAiRequest in;
  ASSERT_FALSE(
      parse_generate_request(R"({"text":"x","return_logprob":true,"logprob_start_len":2})", &in));
  EXPECT_EQ(in.prompt_logprobs_from, 2);
  EXPECT_EQ(in.top_logprobs, 0);
  OpenAiRequest off;
  ASSERT_FALSE(parse_generate_request(R"({"text":"x","logprob_start_len":0})", &off));
  EXPECT_EQ(off.prompt_logprobs_from, -1);
  // max_new_tokens 0: the prompt alone (one token sampled, left out), as SGLang's frontend scores.
  OpenAiRequest zero;
  ASSERT_FALSE(
      parse_generate_request(R"({"text":"x","sampling_params":{"max_new_tokens":0}})", &zero));
  EXPECT_TRUE(zero.prompt_only);
  EXPECT_EQ(zero.max_tokens, 1);
  EXPECT_FALSE(in.prompt_only);

  // Defaults: SGLang's 128 new tokens, temperature 1; a list of prompts is a batch.
  OpenAiRequest d;
  ASSERT_FALSE(parse_generate_request(R"({"text":["a","b"],"rid":["x","y"]})", &d));
  EXPECT_EQ(d.max_tokens, 128);
  EXPECT_EQ(d.sampling.temperature, 1.0f);
  EXPECT_TRUE(d.native_batch);
  EXPECT_EQ(d.num_prompts(), 2);
  EXPECT_EQ(d.top_logprobs, -1);
  OpenAiRequest ids;
  ASSERT_FALSE(parse_generate_request(R"({"input_ids":[1,2,3]})", &ids));
  EXPECT_EQ(ids.token_prompts, (std::vector<std::vector<int32_t>>{{1, 2, 3}}));
  EXPECT_FALSE(ids.native_batch);
  OpenAiRequest id_batch;
  ASSERT_FALSE(parse_generate_request(R"({"input_ids":[[1],[2,3]]})", &id_batch));
  EXPECT_TRUE(id_batch.native_batch);
}

TEST(SglangGenerate, ErrorsNameTheNativeFields) {
  const BadRequestCase cases[] = {
      {R"({"text":"x","sampling_params":{"temperature":3}})", "sampling_params.temperature",
       "'sampling_params.temperature' must be between 0 and 2", ""},
      {R"({"text":"x","sampling_params":{"max_new_tokens":"many"}})",
       "sampling_params.max_new_tokens", "'sampling_params.max_new_tokens' must be an integer", ""},
      {R"({"text":"x","sampling_params":{"sampling_seed":1.5}})", "sampling_params.sampling_seed",
       "must be an integer", ""},
      {R"({"text":"x","sampling_params":{"min_new_tokens":200}})", "sampling_params.min_new_tokens",
       "'sampling_params.min_new_tokens' must be between 0 and max_tokens (128), got 200", ""},
      {R"({"text":"x","sampling_params":{"regex":"a+"}})", "sampling_params.regex", "not supported",
       "unsupported_parameter"},
      {R"({"text":"x","sampling_params":{"temprature":0}})", "sampling_params.temprature",
       "is not a sampling parameter", ""},
      {R"({"text":"x","sampling_params":[1]})", "sampling_params", "must be an object", ""},
      {R"({"sampling_params":{}})", "text", "exactly one of 'text' and 'input_ids'", ""},
      {R"({"text":"x","input_ids":[1]})", "input_ids", "exactly one", ""},
      {R"({"text":""})", "text", "must not be empty", ""},
      {R"({"input_ids":[-1]})", "input_ids", "out of range", ""},
      {R"({"text":"x","image_data":"a.png"})", "image_data", "text models",
       "unsupported_parameter"},
      {R"({"text":"x","lora_path":"a"})", "lora_path", "LoRA", "unsupported_parameter"},
      {R"({"text":"x","return_logprob":true,"logprob_start_len":-2})", "logprob_start_len",
       "-1 or a prompt position", ""},
      {R"({"text":"x","return_logprob":true,"logprob_start_len":"0"})", "logprob_start_len",
       "-1 or a prompt position", ""},
      {R"({"text":"x","return_logprob":true,"top_logprobs_num":50})", "top_logprobs_num",
       "between 0 and 20", ""},
      {R"({"text":"x","sampling_params":{"spaces_between_special_tokens":false}})",
       "sampling_params.spaces_between_special_tokens", "only true", "unsupported_parameter"},
      {R"({"text":["a","b"],"rid":["x"]})", "rid", "one per prompt", ""},
      {R"(["not an object"])", "", "must be a JSON object", ""},
  };
  for (const BadRequestCase& c : cases) {
    OpenAiRequest r;
    auto e = parse_generate_request(c.body, &r);
    expect_bad_request(c, e);
  }
}

TEST(SglangGenerate, ResponseItems) {
  auto tok = Tokenizer::load(std::string(STRATA_SHARED_DIR) + "/models/house-llama");
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  OpenAiRequest req;
  ASSERT_FALSE(parse_generate_request(
      R"({"text":"x","return_logprob":true,"top_logprobs_num":1,"return_text_in_logprobs":true})",
      &req));
  const std::vector<int32_t> ids = tok->encode(" the cat");
  ASSERT_EQ(ids.size(), 2u);
  ChoiceResult c;
  c.text = " the cat";
  c.token_ids = ids;
  c.logprobs = {{-0.5f, {{ids[0], -0.5f}}}, {-1.25f, {{ids[1], -1.25f}}}};
  c.finish_reason = FinishReason::kLength;
  GenerateChoiceMeta meta{"r1", 4, 2, 0.25};
  const nlohmann::json item = build_generate_item(req, c, meta, *tok, 0);
  EXPECT_EQ(item["text"], " the cat");
  EXPECT_EQ(item["output_ids"], nlohmann::json(ids));
  EXPECT_FALSE(item.contains("index"));
  const nlohmann::json& info = item["meta_info"];
  EXPECT_EQ(info["id"], "r1");
  EXPECT_EQ(info["finish_reason"], nlohmann::json({{"type", "length"}, {"length", 2}}));
  EXPECT_EQ(info["prompt_tokens"], 4);
  EXPECT_EQ(info["completion_tokens"], 2);
  EXPECT_EQ(info["cached_tokens"], 2);
  EXPECT_EQ(info["output_token_logprobs"],
            nlohmann::json::parse(fmt::format(R"([[-0.5,{},"{}"],[-1.25,{},"{}"]])", ids[0],
                                              tok->decode(std::vector<int32_t>{ids[0]}), ids[1],
                                              tok->decode(std::vector<int32_t>{ids[1]}))));
  EXPECT_EQ(info["output_top_logprobs"][1][0][1], ids[1]);
  EXPECT_FALSE(info.contains("input_token_logprobs"));  // not asked for

  // The prompt's logprobs from logprob_start_len: token 0 has none (null), tokens from the
  // engine's first scored one carry theirs; before they came, every one is null.
  OpenAiRequest in;
  ASSERT_FALSE(parse_generate_request(
      R"({"text":"x","return_logprob":true,"top_logprobs_num":1,"logprob_start_len":0})", &in));
  c.prompt_ids = {ids[0], ids[1], ids[0]};
  const nlohmann::json none = build_generate_item(in, c, meta, *tok, 0)["meta_info"];
  EXPECT_EQ(none["input_token_logprobs"],
            nlohmann::json::parse(fmt::format(R"([[null,{},null],[null,{},null],[null,{},null]])",
                                              ids[0], ids[1], ids[0])));
  c.prompt_logprobs = {{-2.0f, {{ids[1], -2.0f}}}, {-3.0f, {{ids[1], -0.5f}}}};
  c.prompt_logprobs_from = 1;
  const nlohmann::json scored = build_generate_item(in, c, meta, *tok, 0)["meta_info"];
  EXPECT_EQ(scored["input_token_logprobs"],
            nlohmann::json::parse(fmt::format(R"([[null,{},null],[-2.0,{},null],[-3.0,{},null]])",
                                              ids[0], ids[1], ids[0])));
  EXPECT_TRUE(scored["input_top_logprobs"][0].is_null());
  EXPECT_EQ(scored["input_top_logprobs"][2],
            nlohmann::json::parse(fmt::format(R"([[-0.5,{},null]])", ids[1])));
  in.prompt_logprobs_from = 2;  // logprob_start_len 2: the list starts at token 2
  EXPECT_EQ(build_generate_item(in, c, meta, *tok, 0)["meta_info"]["input_token_logprobs"],
            nlohmann::json::parse(fmt::format(R"([[-3.0,{},null]])", ids[0])));

  c.finish_reason = FinishReason::kStop;
  EXPECT_EQ(build_generate_item(req, c, meta, *tok, 0)["meta_info"]["finish_reason"],
            nlohmann::json({{"type", "stop"}}));
  c.finish_reason = FinishReason::kNone;  // still running (a streamed event)
  EXPECT_TRUE(build_generate_item(req, c, meta, *tok, 0)["meta_info"]["finish_reason"].is_null());
  c.finish_reason = FinishReason::kAbort;
  c.error = "drained";
  EXPECT_EQ(build_generate_item(req, c, meta, *tok, 0)["meta_info"]["finish_reason"],
            nlohmann::json({{"type", "abort"}, {"message", "drained"}}));
}

}  // namespace
}  // namespace strata
