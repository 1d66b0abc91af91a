// Hostile tokenizer files (fuzz/tokenizer_load_fuzz.cc; FUZZING.md): errors, never crashes.
#include <gtest/gtest.h>

#include <string>

#include "tokenizer/tokenizer.h"

namespace strata {
namespace {

TEST(HostileTokenizer, DeeplyNestedJsonIsAnError) {
  auto t = Tokenizer::from_json_text(
      R"({"model": )" + std::string(100000, '[') + std::string(100000, ']') + "}", {},
      "evil/tokenizer.json");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("evil/tokenizer.json: JSON nests deeper than"),
            std::string::npos)
      << t.status().to_string();
}

}  // namespace
}  // namespace strata
