// The server unit tests' table of refused requests: each case's body must be answered 400 with
// its param, a message containing `message`, and its code ("" for none).
#pragma once

#include <gtest/gtest.h>

#include <optional>

#include "server/openai_schema.h"

namespace strata {

struct BadRequestCase {
  const char* body;
  const char* param;
  const char* message;
  const char* code;
};

inline void expect_bad_request(const BadRequestCase& c, const std::optional<ApiError>& e) {
  ASSERT_TRUE(e) << c.body;
  EXPECT_EQ(e->status, 400) << c.body;
  EXPECT_EQ(e->param, c.param) << c.body << " -> " << e->message;
  EXPECT_NE(e->message.find(c.message), std::string::npos) << c.body << " -> " << e->message;
  EXPECT_EQ(e->code, c.code) << c.body;
}

}  // namespace strata
