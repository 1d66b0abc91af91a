// The --api-key decision on its own (server/api_key_auth.h): which paths need the key, which
// Authorization headers pass, the 401 errors' shape, and that no error quotes a key.
#include "server/api_key_auth.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace strata {
namespace {

const std::string kKey = "sk-strata-0123456789abcdef";

TEST(ApiKeyAuthTest, NoKeyLetsEverythingThrough) {
  const ApiKeyAuth none;
  EXPECT_FALSE(none.enabled());
  EXPECT_FALSE(none.check("/v1/completions", std::nullopt));
  EXPECT_FALSE(none.check("/metrics", "Bearer whatever"));
}

TEST(ApiKeyAuthTest, TheRightBearerKeyPasses) {
  const ApiKeyAuth auth(kKey);
  for (const std::string& header : {"Bearer " + kKey, "bearer " + kKey, "BEARER " + kKey,
                                    "  Bearer   " + kKey + "  ", "Bearer\t" + kKey})
    EXPECT_FALSE(auth.check("/v1/chat/completions", header)) << "'" << header << "'";
}

TEST(ApiKeyAuthTest, OnlyTheHealthProbesGoWithoutTheKey) {
  const ApiKeyAuth auth(kKey);
  EXPECT_FALSE(auth.check("/health", std::nullopt));
  EXPECT_FALSE(auth.check("/health_generate", std::nullopt));
  for (const char* path : {"/v1/completions", "/v1/chat/completions", "/v1/models", "/v1/models/m",
                           "/metrics", "/get_server_info", "/server_info", "/flush_cache", "/",
                           "/nope", "/health/", "/healthz", "/v1/health"}) {
    const auto e = auth.check(path, std::nullopt);
    ASSERT_TRUE(e) << path;
    EXPECT_EQ(e->status, 401) << path;
  }
}

// Wrong, missing and malformed keys: 401 with an OpenAI-shaped error that never quotes a key.
TEST(ApiKeyAuthTest, WrongMissingAndMalformedKeysAre401) {
  const ApiKeyAuth auth(kKey);
  struct Case {
    std::optional<std::string> header;
    const char* message_part;
    const char* code;  // "" for null
  };
  const std::vector<Case> cases = {
      {std::nullopt, "didn't provide an API key", ""},
      {"", "didn't provide an API key", ""},
      {"   ", "didn't provide an API key", ""},
      {"Bearer wrong-key", "Incorrect API key", "invalid_api_key"},
      {"Bearer " + kKey.substr(0, kKey.size() - 1), "Incorrect API key",
       "invalid_api_key"},                                               // a prefix
      {"Bearer " + kKey + "x", "Incorrect API key", "invalid_api_key"},  // longer
      {"Bearer " + kKey + " " + kKey, "Incorrect API key", "invalid_api_key"},
      {"Bearer", "Malformed Authorization header", "invalid_api_key"},
      {"Bearer    ", "Malformed Authorization header", "invalid_api_key"},
      {"Bearer" + kKey, "Malformed Authorization header", "invalid_api_key"},
      {kKey, "Malformed Authorization header", "invalid_api_key"},
      {"Basic " + kKey, "Malformed Authorization header", "invalid_api_key"},
      {"Token " + kKey, "Malformed Authorization header", "invalid_api_key"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.header ? "'" + *c.header + "'" : "(no header)");
    const std::optional<std::string_view> header =
        c.header ? std::optional<std::string_view>(*c.header) : std::nullopt;
    const auto e = auth.check("/v1/completions", header);
    ASSERT_TRUE(e);
    EXPECT_EQ(e->status, 401);
    EXPECT_NE(e->message.find(c.message_part), std::string::npos) << e->message;
    EXPECT_EQ(e->message.find(kKey.substr(0, 8)), std::string::npos) << e->message;
    EXPECT_EQ(e->message.find("wrong-key"), std::string::npos) << e->message;
    const auto j = e->to_json();
    ASSERT_TRUE(j.contains("error"));
    EXPECT_EQ(j["error"]["type"], "invalid_request_error");
    EXPECT_TRUE(j["error"]["param"].is_null());
    if (*c.code)
      EXPECT_EQ(j["error"]["code"], c.code);
    else
      EXPECT_TRUE(j["error"]["code"].is_null());
  }
}

TEST(ApiKeyAuthTest, ConstantTimeEqualIsEquality) {
  EXPECT_TRUE(constant_time_equal("", ""));
  EXPECT_TRUE(constant_time_equal(kKey, kKey));
  EXPECT_FALSE(constant_time_equal(kKey, ""));
  EXPECT_FALSE(constant_time_equal("", kKey));
  EXPECT_FALSE(constant_time_equal("abc", "abd"));
  EXPECT_FALSE(constant_time_equal(std::string_view("abc\0", 4), "abc"));
  EXPECT_FALSE(constant_time_equal("xbc", "abc"));
  // Every single-byte change anywhere is seen.
  for (size_t i = 0; i < kKey.size(); ++i) {
    std::string k = kKey;
    k[i] ^= 1;
    EXPECT_FALSE(constant_time_equal(k, kKey)) << i;
  }
}

TEST(ApiKeyAuthTest, KeysAnHttpHeaderCannotCarryAreRefused) {
  EXPECT_TRUE(validate_api_key(kKey, "--api-key").ok());
  for (const std::string& bad :
       {std::string(), std::string("has space"), std::string("tab\there"), std::string("new\nline"),
        std::string("caf\xc3\xa9"), std::string(5000, 'k')}) {
    const Status s = validate_api_key(bad, "--api-key");
    EXPECT_FALSE(s.ok()) << bad;
    EXPECT_NE(s.message().find("--api-key"), std::string::npos) << s.message();
    if (bad.size() > 3) {
      EXPECT_EQ(s.message().find(bad), std::string::npos) << s.message();
    }
  }
}

}  // namespace
}  // namespace strata
