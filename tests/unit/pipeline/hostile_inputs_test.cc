// Hostile dataset lines found by fuzzing (fuzz/dataset_fuzz.cc; FUZZING.md): each must be an
// error naming the line, never a crash.
#include <gtest/gtest.h>

#include <string>

#include "pipeline/dataset.h"

namespace strata {
namespace {

// The line parsed (nlohmann::json parses iteratively), but the runner's copy of it for the
// output line recursed once per level and overflowed the stack.
TEST(HostileDataset, DeeplyNestedLineIsAnError) {
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  auto r = parse_prompt_line(R"({"prompt": "x", "extra": )" + deep + "}", 7, "define");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("define line 7: JSON nests deeper than"), std::string::npos)
      << r.status().to_string();
  // Ordinary nesting is fine.
  auto ok = parse_prompt_line(R"({"prompt": "x", "meta": {"a": [[1, {"b": []}]]}})", 8, "define");
  EXPECT_TRUE(ok.ok()) << ok.status().to_string();
}

// Found by fuzz/dataset_fuzz.cc with a fixed seed (fuzz/corpus/dataset/crash_number_overflow): a
// number beyond double threw out_of_range past the parse_error handler and aborted the job.
TEST(HostileDataset, NumberOverflowIsAnError) {
  auto r = parse_prompt_line(R"({"prompt": "x", "seed": 7.888E88888888888})", 3, "define");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("define line 3: malformed JSON"), std::string::npos)
      << r.status().to_string();
}

}  // namespace
}  // namespace strata
