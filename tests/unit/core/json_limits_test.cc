#include "core/json_limits.h"

#include <gtest/gtest.h>

#include <string>

namespace strata {
namespace {

std::string nested(int depth, char open = '[', char close = ']') {
  return std::string(size_t(depth), open) + std::string(size_t(depth), close);
}

TEST(JsonLimits, CountsNestingOutsideStrings) {
  EXPECT_EQ(json_nesting_depth("1"), 0);
  EXPECT_EQ(json_nesting_depth(R"({"a": [1, {"b": []}], "c": {}})"), 4);
  EXPECT_EQ(json_nesting_depth(R"({"s": "[[[[{{{{"})"), 1);
  EXPECT_EQ(json_nesting_depth(R"(["\"[[[", "\\", [2]])"), 2);  // escaped quote, escaped backslash
  EXPECT_EQ(json_nesting_depth(nested(512)), 512);
}

TEST(JsonLimits, StopsPastTheLimit) {
  EXPECT_EQ(json_nesting_depth(nested(100000), 10), 11);
  EXPECT_EQ(json_nesting_depth("]]]]]]]]" + nested(3)), 3);  // stray closers do not go negative
}

TEST(JsonLimits, CheckNamesTheInput) {
  EXPECT_TRUE(check_json_depth(nested(kMaxJsonDepth, '{', '}'), "x").ok());
  Status s = check_json_depth(nested(kMaxJsonDepth + 1), "request body");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("request body: JSON nests deeper than 512 levels"), std::string::npos)
      << s.to_string();
}

}  // namespace
}  // namespace strata
