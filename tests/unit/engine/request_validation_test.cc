// The request contract (engine/request_validation.h): every bad value is refused with the field
// that holds it, in one wording, and a request that can never fit is refused for its length.
#include "engine/request_validation.h"

#include <gtest/gtest.h>

#include <vector>

namespace strata {
namespace {

struct BadValue {
  const char* param;
  SamplingParams params;
};

TEST(RequestValidation, EachBadSamplingValueNamesItsField) {
  const BadValue cases[] = {
      {"temperature", {.temperature = -0.5f}},
      {"temperature", {.temperature = 2.5f}},
      {"top_p", {.top_p = 0.0f}},
      {"top_p", {.top_p = 1.5f}},
      {"top_k", {.top_k = -2}},
      {"min_p", {.min_p = -0.1f}},
      {"min_p", {.min_p = 1.5f}},
      {"repetition_penalty", {.repetition_penalty = 0.0f}},
      {"repetition_penalty", {.repetition_penalty = 2.5f}},
      {"presence_penalty", {.presence_penalty = 2.5f}},
      {"frequency_penalty", {.frequency_penalty = -3.0f}},
      {"logit_bias", {.logit_bias = {{5, 101.0f}}}},
      {"logit_bias", {.logit_bias = {{-1, 1.0f}}}},
      {"logit_bias", {.logit_bias = {{7, 1.0f}, {7, 2.0f}}}},
      {"stop_token_ids", {.stop_token_ids = {-3}}},
      {"max_tokens", {.max_new_tokens = 0}},
  };
  for (const BadValue& c : cases) {
    auto e = validate_sampling(c.params);
    ASSERT_TRUE(e) << c.param;
    EXPECT_EQ(e->code, RequestErrorCode::kInvalidValue) << c.param;
    EXPECT_EQ(e->param, c.param);
    EXPECT_TRUE(e->about_value) << c.param;
    // Each front end names the field its own way; the value follows.
    EXPECT_EQ(e->describe().rfind(std::string("'") + c.param + "' ", 0), 0u) << e->describe();
    EXPECT_EQ(e->describe("--flag").rfind("--flag ", 0), 0u) << e->describe("--flag");
  }
  // The edges are accepted.
  for (const SamplingParams& ok : {SamplingParams{.temperature = 0.0f},
                                   SamplingParams{.temperature = 2.0f, .top_p = 1.0f, .top_k = 0},
                                   SamplingParams{.top_k = -1,
                                   .min_p = 1.0f,
                                   .repetition_penalty = 2.0f,
                                   .presence_penalty = -2.0f,
                                   .frequency_penalty = 2.0f,
                                   .logit_bias = {{0, -100.0f}, {9, 100.0f}}}})
    EXPECT_FALSE(validate_sampling(ok)) << validate_sampling(ok)->describe();
  EXPECT_EQ(validate_sampling({.temperature = 3.0f})->describe(),
            "'temperature' must be between 0 and 2, got 3");
}

TEST(RequestValidation, TokenIdsAreCheckedAgainstTheVocabulary) {
  const SamplingParams bias{.logit_bias = {{1000, 1.0f}}};
  EXPECT_FALSE(validate_sampling(bias));  // vocabulary not known: any id >= 0
  auto e = validate_sampling(bias, 1000);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "logit_bias");
  EXPECT_NE(e->describe().find("1000"), std::string::npos) << e->describe();

  const RequestLimits limits{.vocab_size = 100, .context_length = 64, .kv_capacity_tokens = 1000};
  const std::vector<int32_t> prompt{1, 2, 100};
  e = validate_request(prompt, {.max_new_tokens = 4}, {}, limits);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "prompt");
  EXPECT_NE(e->message.find("token id 100"), std::string::npos) << e->message;
  EXPECT_EQ(validate_request(std::vector<int32_t>{}, {}, {}, limits)->param, "prompt");
  // A resumed output must leave something to generate.
  const std::vector<int32_t> ok{1, 2, 3}, resumed{4, 5};
  EXPECT_FALSE(validate_request(ok, {.max_new_tokens = 3}, resumed, limits));
  EXPECT_TRUE(validate_request(ok, {.max_new_tokens = 2}, resumed, limits));
}

TEST(RequestValidation, RequestsThatCanNeverFitAreRefusedForTheirLength) {
  // The model's context is the limit.
  RequestLimits limits{.vocab_size = 0, .context_length = 16, .kv_capacity_tokens = 1000};
  const std::vector<int32_t> prompt(10, 1), full(16, 1);
  EXPECT_FALSE(validate_request(prompt, {.max_new_tokens = 6}, {}, limits));
  auto e = validate_request(prompt, {.max_new_tokens = 7}, {}, limits);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code, RequestErrorCode::kContextLengthExceeded);
  EXPECT_EQ(e->param, "max_tokens");
  EXPECT_EQ(
      e->message,
      "This model's maximum context length is 16 tokens. However, you requested 17 tokens (10 in "
      "the prompt, 7 for the completion).");
  e = validate_request(full, {.max_new_tokens = 1}, {}, limits);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "prompt");
  EXPECT_NE(e->message.find("your prompt has 16 tokens, leaving no room"), std::string::npos)
      << e->message;
  // The KV pool is smaller: the message says so and names the flags that give it room.
  limits.kv_capacity_tokens = 12;
  e = validate_request(prompt, {.max_new_tokens = 3}, {}, limits);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code, RequestErrorCode::kContextLengthExceeded);
  EXPECT_NE(
      e->message.find(
          "maximum context length is 12 tokens (the KV cache pool holds 12 tokens, less than the "
          "model's 16"),
      std::string::npos)
      << e->message;
  EXPECT_NE(e->message.find("--max-total-tokens"), std::string::npos) << e->message;
  EXPECT_EQ(e->to_status().code(), StatusCode::kOutOfRange);
}

}  // namespace
}  // namespace strata
