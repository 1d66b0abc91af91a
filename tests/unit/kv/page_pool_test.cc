#include "kv/page_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

namespace strata {
namespace {

TEST(PagePool, AllocateIsAllOrNothing) {
  PagePool pool(8, 4);
  EXPECT_EQ(pool.capacity_tokens(), 32);
  auto a = pool.allocate(5);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->size(), 5u);
  EXPECT_EQ(pool.num_free_pages(), 3);
  EXPECT_FALSE(pool.allocate(4).has_value());
  EXPECT_EQ(pool.num_free_pages(), 3);  // unchanged by the failed call
  auto empty = pool.allocate(0);
  ASSERT_TRUE(empty.has_value());
  EXPECT_TRUE(empty->empty());
  pool.check_invariants();
}

TEST(PagePool, RefcountsFreeOnLastRelease) {
  PagePool pool(2, 1);
  auto a = *pool.allocate(1);
  pool.retain(a[0]);
  EXPECT_EQ(pool.refcount(a[0]), 2);
  pool.release(a[0]);
  EXPECT_EQ(pool.num_free_pages(), 1);
  pool.release(a[0]);
  EXPECT_EQ(pool.num_free_pages(), 2);
  EXPECT_EQ(pool.refcount(a[0]), 0);
  pool.check_invariants();
}

TEST(PagePool, PagesForTokens) {
  PagePool pool(4, 16);
  EXPECT_EQ(pool.pages_for_tokens(0), 0);
  EXPECT_EQ(pool.pages_for_tokens(1), 1);
  EXPECT_EQ(pool.pages_for_tokens(16), 1);
  EXPECT_EQ(pool.pages_for_tokens(17), 2);
}

TEST(PagePoolDeathTest, ReleaseOfFreePageAborts) {
  PagePool pool(2, 1);
  EXPECT_DEATH(pool.release(0), "release of free page");
  EXPECT_DEATH(pool.retain(1), "retain of free page");
}

// Random holders take, share and drop pages; refcounts must always equal the holders' counts.
TEST(PagePool, RandomizedHoldersMatchRefcounts) {
  std::mt19937 rng(7);
  PagePool pool(64, 2);
  std::vector<std::vector<PageId>> holders;
  for (int step = 0; step < 20000; ++step) {
    int op = rng() % 4;
    if (op == 0) {
      int n = rng() % 12;
      int free_before = pool.num_free_pages();
      auto got = pool.allocate(n);
      EXPECT_EQ(got.has_value(), n <= free_before);
      if (got) holders.push_back(*got);
    } else if (op == 1 && !holders.empty()) {
      // A new holder shares a random subset of an existing holder's pages.
      const auto& src = holders[rng() % holders.size()];
      std::vector<PageId> share;
      for (PageId p : src)
        if (rng() % 2) share.push_back(p);
      pool.retain(share);
      holders.push_back(share);
    } else if (!holders.empty()) {
      size_t i = rng() % holders.size();
      pool.release(holders[i]);
      holders.erase(holders.begin() + i);
    }
    pool.check_invariants();
    std::vector<int> expected(pool.num_pages(), 0);
    for (const auto& h : holders)
      for (PageId p : h) ++expected[p];
    for (PageId p = 0; p < pool.num_pages(); ++p) ASSERT_EQ(pool.refcount(p), expected[p]) << p;
  }
  for (const auto& h : holders) pool.release(h);
  EXPECT_EQ(pool.num_free_pages(), pool.num_pages());
  pool.check_invariants();
}

}  // namespace
}  // namespace strata
