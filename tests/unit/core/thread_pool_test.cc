// parallel_for runs every index exactly once per call, also when calls follow each other as fast
// as possible (a worker woken for one call must not take chunks of the next: a race that
// ThreadSanitizer found, where a chunk could run twice and a call return while one still ran).
#include "core/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <vector>

namespace strata {
namespace {

TEST(ThreadPool, EveryIndexOnceAcrossBackToBackCalls) {
  std::vector<std::atomic<int>> hits(64);
  for (int call = 0; call < 20000; ++call) {
    const int64_t n = 2 + call % 63;
    for (int64_t i = 0; i < n; ++i) hits[size_t(i)].store(0);
    parallel_for(n, 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) hits[size_t(i)].fetch_add(1);
    });
    // Every chunk has finished when parallel_for returns.
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(hits[size_t(i)].load(), 1) << "call " << call << " index " << i;
  }
}

TEST(ThreadPool, NestedCallsRunInline) {
  std::atomic<int64_t> sum{0};
  parallel_for(8, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      parallel_for(4, 1, [&](int64_t b2, int64_t e2) { sum.fetch_add(e2 - b2); });
    }
  });
  EXPECT_EQ(sum.load(), 32);
}

}  // namespace
}  // namespace strata
