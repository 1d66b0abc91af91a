// CHECK: aborts with file:line on a broken invariant (a bug, never user input).
#pragma once

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>

namespace strata::detail {
[[noreturn]] inline void check_failed(const char* file, int line, const char* cond,
                                      const std::string& msg) {
  std::fprintf(stderr, "CHECK failed at %s:%d: %s %s\n", file, line, cond, msg.c_str());
  std::fflush(stderr);
  std::abort();
}
}  // namespace strata::detail

#define CHECK(cond)                                                             \
  do {                                                                          \
    if (!(cond)) ::strata::detail::check_failed(__FILE__, __LINE__, #cond, ""); \
  } while (0)

// CHECK_MSG(n > 0, "n={}", n)
#define CHECK_MSG(cond, ...)                                                               \
  do {                                                                                     \
    if (!(cond))                                                                           \
      ::strata::detail::check_failed(__FILE__, __LINE__, #cond, fmt::format(__VA_ARGS__)); \
  } while (0)

#define CHECK_EQ(a, b) CHECK_MSG((a) == (b), "({} vs {})", (a), (b))
#define CHECK_NE(a, b) CHECK_MSG((a) != (b), "({} vs {})", (a), (b))
#define CHECK_LT(a, b) CHECK_MSG((a) < (b), "({} vs {})", (a), (b))
#define CHECK_LE(a, b) CHECK_MSG((a) <= (b), "({} vs {})", (a), (b))
#define CHECK_GT(a, b) CHECK_MSG((a) > (b), "({} vs {})", (a), (b))
#define CHECK_GE(a, b) CHECK_MSG((a) >= (b), "({} vs {})", (a), (b))
