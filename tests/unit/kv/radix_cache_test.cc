#include "kv/radix_cache.h"

#include <gtest/gtest.h>

#include <map>
#include <random>

namespace strata {
namespace {

using Tokens = std::vector<int32_t>;

TEST(RadixCache, MatchInsertSplitPageSizeOne) {
  PagePool pool(16, 1);
  RadixCache cache(&pool);
  Tokens a = {1, 2, 3, 4};
  auto pages = *pool.allocate(4);
  EXPECT_EQ(cache.insert(a, pages), 0);
  EXPECT_EQ(cache.cached_pages(), 4);
  EXPECT_EQ(pool.num_used_pages(), 4);  // the tree adopted the references

  auto m = cache.match_prefix(Tokens{1, 2, 9});
  EXPECT_EQ(m.matched_tokens, 2);
  EXPECT_EQ(m.pages, (std::vector<PageId>{pages[0], pages[1]}));
  EXPECT_EQ(cache.path_tokens(m.node), 2);  // the node was split at the match end
  cache.check_invariants();

  // Inserting {1,2,5} with a duplicate page for {1,2}: the duplicates are released.
  auto dup = *pool.allocate(3);
  EXPECT_EQ(cache.insert(Tokens{1, 2, 5}, dup), 2);
  EXPECT_EQ(pool.refcount(dup[0]), 0);
  EXPECT_EQ(pool.refcount(dup[1]), 0);
  EXPECT_EQ(pool.refcount(dup[2]), 1);
  EXPECT_EQ(cache.cached_pages(), 5);
  EXPECT_EQ(cache.match_prefix(Tokens{1, 2, 5, 7}).pages,
            (std::vector<PageId>{pages[0], pages[1], dup[2]}));
  cache.check_invariants();
  pool.check_invariants();
}

TEST(RadixCache, OnlyFullPagesMatch) {
  PagePool pool(16, 4);
  RadixCache cache(&pool);
  Tokens a = {1, 2, 3, 4, 5, 6, 7, 8};
  cache.insert(a, *pool.allocate(2));
  EXPECT_EQ(cache.match_prefix(Tokens{1, 2, 3, 4, 5, 6, 7}).matched_tokens, 4);
  EXPECT_EQ(cache.match_prefix(Tokens{1, 2, 3}).matched_tokens, 0);
  EXPECT_EQ(cache.match_prefix(Tokens{1, 2, 3, 4, 5, 6, 7, 8, 9}).matched_tokens, 8);
  EXPECT_EQ(cache.match_prefix(Tokens{1, 2, 3, 5, 5, 6, 7, 8}).matched_tokens, 0);
  auto peek = cache.peek_prefix(Tokens{1, 2, 3, 4, 5, 6, 7, 8});
  EXPECT_EQ(peek.matched_tokens, 8);
  EXPECT_EQ(peek.evictable_pages, 2);
  cache.check_invariants();
}

TEST(RadixCache, LockedPrefixesSurviveEvictionAndLruOrder) {
  PagePool pool(16, 1);
  RadixCache cache(&pool);
  cache.insert(Tokens{1, 1}, *pool.allocate(2));  // oldest
  cache.insert(Tokens{2, 2}, *pool.allocate(2));
  cache.insert(Tokens{3, 3}, *pool.allocate(2));  // newest
  cache.match_prefix(Tokens{1, 1});               // now {2,2} is the oldest
  auto locked = cache.match_prefix(Tokens{3, 3});
  cache.inc_lock_ref(locked.node);
  EXPECT_EQ(cache.evictable_pages(), 4);
  EXPECT_EQ(cache.locked_pages(), 2);
  EXPECT_EQ(cache.evict(1), 2);  // whole node {2,2}
  EXPECT_EQ(cache.match_prefix(Tokens{2, 2}).matched_tokens, 0);
  EXPECT_EQ(cache.match_prefix(Tokens{1, 1}).matched_tokens, 2);
  EXPECT_EQ(cache.evict(100), 2);  // only {1,1} is unlocked
  EXPECT_EQ(cache.match_prefix(Tokens{3, 3}).matched_tokens, 2);
  EXPECT_FALSE(cache.reset());  // locked
  cache.dec_lock_ref(locked.node);
  EXPECT_TRUE(cache.reset());
  EXPECT_EQ(pool.num_free_pages(), 16);
  EXPECT_EQ(cache.stats().evicted_pages, 4);
  cache.check_invariants();
}

// A brute-force model: every cached page-aligned prefix -> its page. The tree is prefix-closed,
// so the expected match is the longest run of cached prefixes.
struct Model {
  std::map<Tokens, PageId> prefix_page;
  std::map<Tokens, int> locks;  // locked prefix -> holders

  int32_t match(const Tokens& t, int page_size, std::vector<PageId>* pages) const {
    Tokens key;
    int32_t matched = 0;
    for (size_t i = 0; i + page_size <= t.size(); i += page_size) {
      key.insert(key.end(), t.begin() + i, t.begin() + i + page_size);
      auto it = prefix_page.find(key);
      if (it == prefix_page.end()) break;
      pages->push_back(it->second);
      matched += page_size;
    }
    return matched;
  }
};

struct Holder {
  Tokens tokens;              // full pages only
  std::vector<PageId> pages;  // one reference each
  RadixNodeHandle node;       // locked
  Tokens locked_prefix;
};

void run_randomized(int page_size, uint32_t seed) {
  std::mt19937 rng(seed);
  PagePool pool(48, page_size);
  RadixCache cache(&pool);
  Model model;
  cache.set_evict_hook([&](const EvictedNode& e) {
    // The evicted node's prefixes leave the model; none may be locked.
    Tokens path(e.path_tokens.begin(), e.path_tokens.end());
    for (auto& [locked, n] : model.locks) {
      ASSERT_FALSE(
          locked.size() >= static_cast<size_t>(e.first_token + page_size) &&
          std::equal(path.begin(), path.begin() + e.first_token + page_size, locked.begin()))
          << "evicted a locked prefix";
    }
    for (size_t i = 0; i < e.pages.size(); ++i) {
      Tokens key(path.begin(), path.begin() + e.first_token + (i + 1) * page_size);
      auto it = model.prefix_page.find(key);
      ASSERT_TRUE(it != model.prefix_page.end());
      ASSERT_EQ(it->second, e.pages[i]);
      model.prefix_page.erase(it);
    }
  });
  std::vector<Holder> holders;
  int64_t lookups = 0, hits = 0;
  auto random_tokens = [&]() {
    Tokens t;
    int n = rng() % 24;
    // Reuse a held sequence's start half the time so prefixes overlap heavily.
    if (!holders.empty() && rng() % 2) {
      const Tokens& base = holders[rng() % holders.size()].tokens;
      t.assign(base.begin(), base.begin() + std::min<size_t>(base.size(), rng() % 20));
    }
    while (static_cast<int>(t.size()) < n) t.push_back(rng() % 3);
    return t;
  };

  for (int step = 0; step < 6000; ++step) {
    int op = rng() % 10;
    if (op < 4) {  // a request starts: match, lock, retain, allocate its own pages
      Tokens t = random_tokens();
      t.resize(t.size() / page_size * page_size);
      std::vector<PageId> expected_pages;
      int32_t expected = model.match(t, page_size, &expected_pages);
      RadixPeek peek = cache.peek_prefix(t);
      RadixMatch m = cache.match_prefix(t);
      lookups += t.size();
      hits += m.matched_tokens;
      ASSERT_EQ(m.matched_tokens, expected);
      ASSERT_EQ(peek.matched_tokens, expected);
      ASSERT_EQ(m.pages, expected_pages);
      ASSERT_EQ(cache.path_tokens(m.node), m.matched_tokens);
      ASSERT_EQ(cache.path_pages(m.node), m.pages);
      cache.inc_lock_ref(m.node);
      Tokens locked(t.begin(), t.begin() + m.matched_tokens);
      if (!locked.empty()) ++model.locks[locked];
      pool.retain(m.pages);
      Holder h{.tokens = t, .pages = m.pages, .node = m.node, .locked_prefix = locked};
      int32_t need = static_cast<int32_t>(t.size() - m.matched_tokens) / page_size;
      if (pool.num_free_pages() < need) cache.evict(need - pool.num_free_pages());
      if (!pool.allocate_into(need, &h.pages)) {  // give up: drop everything again
        pool.release(h.pages);
        cache.dec_lock_ref(h.node);
        if (!locked.empty() && --model.locks[locked] == 0) model.locks.erase(locked);
      } else {
        holders.push_back(std::move(h));
      }
    } else if (op < 7 && !holders.empty()) {  // a request finishes: insert, unlock
      size_t i = rng() % holders.size();
      Holder h = std::move(holders[i]);
      holders.erase(holders.begin() + i);
      std::vector<PageId> cached_before;
      int32_t expected_dup = model.match(h.tokens, page_size, &cached_before);
      // Pages of new prefixes join the model.
      Tokens key;
      for (size_t k = 0; k < h.pages.size(); ++k) {
        key.insert(key.end(), h.tokens.begin() + k * page_size,
                   h.tokens.begin() + (k + 1) * page_size);
        model.prefix_page.emplace(key, h.pages[k]);
      }
      ASSERT_EQ(cache.insert(h.tokens, h.pages), expected_dup);
      cache.dec_lock_ref(h.node);
      if (!h.locked_prefix.empty() && --model.locks[h.locked_prefix] == 0)
        model.locks.erase(h.locked_prefix);
    } else if (op < 9) {
      cache.evict(rng() % 6);
    } else if (holders.empty()) {
      ASSERT_TRUE(cache.reset());
      model.prefix_page.clear();
    }

    // Invariants: structure; refcount == tree + holders; nothing is owned twice by one holder.
    pool.check_invariants();
    cache.check_invariants();
    std::vector<int> expected(pool.num_pages(), 0);
    cache.for_each_page([&](PageId p) { ++expected[p]; });
    for (const Holder& h : holders)
      for (PageId p : h.pages) ++expected[p];
    for (PageId p = 0; p < pool.num_pages(); ++p) ASSERT_EQ(pool.refcount(p), expected[p]);
    ASSERT_EQ(cache.cached_pages(), static_cast<int32_t>(model.prefix_page.size()));
  }
  RadixCacheStats s = cache.stats();
  EXPECT_EQ(s.lookup_tokens, lookups);
  EXPECT_EQ(s.hit_tokens, hits);
  EXPECT_GT(s.hit_tokens, 0);
  EXPECT_GT(s.evicted_pages, 0);
  // Drain: every request finishes, the cache is flushed, and every page is free again.
  for (Holder& h : holders) {
    cache.insert(h.tokens, h.pages);
    cache.dec_lock_ref(h.node);
  }
  EXPECT_TRUE(cache.reset());
  cache.check_invariants();
  pool.check_invariants();
  EXPECT_EQ(pool.num_free_pages(), pool.num_pages());
}

TEST(RadixCache, RandomizedAgainstBruteForcePageSize1) { run_randomized(1, 1); }
TEST(RadixCache, RandomizedAgainstBruteForcePageSize2) { run_randomized(2, 2); }
TEST(RadixCache, RandomizedAgainstBruteForcePageSize4) { run_randomized(4, 3); }

}  // namespace
}  // namespace strata
