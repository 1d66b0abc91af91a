// Hostile request bodies (fuzz/openai_request_fuzz.cc; FUZZING.md): each a 400, never a crash.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "server/openai_schema.h"
#include "tokenizer/prompt_encoder.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace strata {
namespace {

TEST(ServerHostileTest, DeeplyNestedBodyIsInvalidJson) {
  const std::string deep = std::string(300000, '[') + std::string(300000, ']');
  OpenAiRequest r;
  auto e =
      parse_openai_request(R"({"messages": [{"role": "user", "content": "x", "x": )" + deep + "}]}",
                           Endpoint::kChat, &r);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->status, 400);
  EXPECT_EQ(e->code, "invalid_json");
  EXPECT_NE(e->message.find("nests deeper than"), std::string::npos) << e->message;
}

// Found by fuzz/openai_request_fuzz.cc (fuzz/corpus/openai_request/crash_error_message_utf8): the
// JSON parser's message quotes the bytes where it stopped, which cut a 2-byte character in half,
// and the error body could not be serialized.
TEST(ServerHostileTest, ParseErrorMessageIsValidUtf8) {
  const std::string body = std::string("{\xd4\x8frompt\": ") + '\0' + "{\"prom[[1p" + '\0';
  OpenAiRequest r;
  auto e = parse_openai_request(body, Endpoint::kCompletions, &r);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code, "invalid_json");
  EXPECT_TRUE(tok::is_valid_utf8(e->message)) << e->message;
  EXPECT_NO_THROW((void)e->to_json().dump());
}

// Found by fuzz/openai_request_fuzz.cc with a fixed seed (fuzz/corpus/openai_request/
// crash_number_overflow): a number beyond double made the parser throw out_of_range, not
// parse_error, which nothing caught: one request body took the server down.
TEST(ServerHostileTest, NumberOverflowIsInvalidJson) {
  for (const char* body : {R"({"prompt": "x", "max_tokens": 1e999})",
                           R"({"prompt": "x", "temperature": -7.8E888888})"}) {
    OpenAiRequest r;
    auto e = parse_openai_request(body, Endpoint::kCompletions, &r);
    ASSERT_TRUE(e) << body;
    EXPECT_EQ(e->status, 400);
    EXPECT_EQ(e->code, "invalid_json");
    EXPECT_NE(e->message.find("number overflow"), std::string::npos) << e->message;
  }
}

// The server refuses text longer than max_prompt_bytes(context) before tokenizing (64 MiB of
// spaces took the BPE minutes). The bound must never refuse a prompt that fits: check it against
// the Hugging Face token counts of the fixture strings.
TEST(ServerHostileTest, PromptByteBoundHoldsForFixtures) {
  const std::string dir = std::string(STRATA_SHARED_DIR) + "/models/house-llama";
  auto tok = Tokenizer::load(dir);
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  auto enc = PromptEncoder::load(dir, *tok);
  ASSERT_TRUE(enc.ok()) << enc.status().to_string();
  std::ifstream in(std::string(STRATA_SHARED_DIR) + "/fixtures/tokenizer_cases.json");
  const nlohmann::json cases = nlohmann::json::parse(in);
  for (const auto& c : cases["cases"]) {
    const std::string text = c["text"];
    EXPECT_LE(text.size(), enc->max_prompt_bytes(int64_t(c["ids"].size()))) << text;
  }
  EXPECT_EQ(enc->max_prompt_bytes(0), 0u);
  const size_t max_bytes = enc->max_prompt_bytes(16);
  nlohmann::json long_chat = {{{"role", "user"}, {"content", std::string(max_bytes, ' ')}}};
  auto ids = enc->encode_chat(long_chat, true, max_bytes);
  ASSERT_FALSE(ids.ok());
  EXPECT_EQ(ids.status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(ids.status().message().find("more than the context can hold"), std::string::npos);
  const nlohmann::json short_chat = {{{"role", "user"}, {"content", "hi"}}};
  EXPECT_TRUE(enc->encode_chat(short_chat, true, max_bytes).ok());
}

}  // namespace
}  // namespace strata
