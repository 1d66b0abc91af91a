// --log-requests lines (server/request_log.h): what each level adds, text cut at level 2 and
// whole at 3, one line however the text looks.
#include "server/request_log.h"

#include <gtest/gtest.h>

namespace strata {
namespace {

OpenAiRequest completion(std::string prompt) {
  OpenAiRequest r;
  r.text_prompts = {std::move(prompt)};
  r.max_tokens = 7;
  r.sampling.temperature = 0.5f;
  return r;
}

TEST(RequestLogTest, EachLevelAddsItsPart) {
  const OpenAiRequest r = completion("line one\nline \"two\"");
  const ResponseMeta meta{.id = "cmpl-1", .created = 0, .model = "m"};
  const std::string l0 = describe_received(r, meta, {5}, 0),
                    l1 = describe_received(r, meta, {5}, 1),
                    l2 = describe_received(r, meta, {5}, 2);
  EXPECT_EQ(l0, "Receive: POST /v1/completions id=cmpl-1 prompts=1 prompt_tokens=[5]");
  EXPECT_NE(l1.find("max_tokens=7 temperature=0.5"), std::string::npos) << l1;
  EXPECT_EQ(l1.find("prompt="), std::string::npos) << l1;
  EXPECT_NE(l2.find(R"(prompt="line one\nline \"two\"")"), std::string::npos) << l2;
  EXPECT_EQ(l2.find('\n'), std::string::npos) << l2;

  ChoiceResult c;
  c.text = "out";
  c.finish_reason = FinishReason::kLength;
  const Usage u{.prompt_tokens = 5, .completion_tokens = 1, .cached_tokens = 0};
  const std::string f0 = describe_finished(r, meta, {c}, u, 0.25, 0),
                    f2 = describe_finished(r, meta, {c}, u, 0.25, 2);
  EXPECT_NE(f0.find("id=cmpl-1"), std::string::npos) << f0;
  EXPECT_NE(f0.find("length"), std::string::npos) << f0;
  EXPECT_NE(f0.find("completion_tokens=1"), std::string::npos) << f0;
  EXPECT_NE(f0.find("e2e=0.250s"), std::string::npos) << f0;
  EXPECT_EQ(f0.find("output="), std::string::npos) << f0;
  EXPECT_NE(f2.find(R"(output="out")"), std::string::npos) << f2;
}

TEST(RequestLogTest, Level2CutsLongTextLevel3KeepsIt) {
  const std::string long_text(kPartialChars + 100, 'a');
  const OpenAiRequest r = completion(long_text);
  const ResponseMeta meta{.id = "cmpl-2", .created = 0, .model = "m"};
  const std::string l2 = describe_received(r, meta, {1}, 2),
                    l3 = describe_received(r, meta, {1}, 3);
  EXPECT_EQ(l2.find(long_text), std::string::npos);
  EXPECT_NE(l2.find(std::string(kPartialChars, 'a') + "\"…(+100 bytes)"), std::string::npos)
      << l2.substr(l2.size() - 40);
  EXPECT_NE(l3.find(long_text), std::string::npos);
}

}  // namespace
}  // namespace strata
