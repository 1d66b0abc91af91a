// The host KV tier's policy (kv/hicache.h) against a fake copier whose copies land late, in
// randomized operation sequences with the invariants of both tiers checked after every step.
// Page "contents" are signatures of the token path they hold, so a wrong copy, a reused page
// or a dropped in-flight page shows up as a wrong signature when a request reads its pages.
#include "kv/hicache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <unordered_set>

#include "core/check.h"
#include "support/late_copier.h"

namespace strata {
namespace {

uint64_t signature(std::span<const int32_t> tokens, int32_t page, int32_t page_size) {
  uint64_t h = 1469598103934665603ULL;
  for (size_t i = 0; i < size_t(page + 1) * size_t(page_size); ++i) {
    h ^= uint32_t(tokens[i]);
    h *= 1099511628211ULL;
  }
  return h | 1;  // never 0: 0 marks a page never written
}

// Copies land late (support/late_copier.h): one page is one signature, 100 bytes as the tier
// counts them; done() lands each queued copy with probability 1/3.
using FakeIo = testing::LateCopier<uint64_t>;
constexpr testing::LateCopierShape kSignaturePages{
    .slots_per_page = 1, .page_bytes = 100, .land_one_in = 3};

// A request as ScheduleState keeps one: a locked device prefix plus pages of its own.
struct Req {
  std::vector<int32_t> tokens;
  RadixNodeHandle node = nullptr;
  int32_t cached_pages = 0;
  std::vector<PageId> pages;
  int32_t kv_len = 0;
};

class Harness {
 public:
  Harness(uint32_t seed, HiCacheWritePolicy policy, int32_t page_size, int32_t device_pages,
          int32_t host_pages)
      : rng_(seed),
        ps_(page_size),
        pool_(device_pages, page_size),
        cache_(&pool_),
        host_(host_pages, page_size),
        content_(size_t(device_pages), 0),
        io_(&content_, host_pages, kSignaturePages, &rng_),
        hc_(&pool_, &cache_, &host_, &io_, policy) {
    std::uniform_int_distribution<int32_t> tok(0, 40);
    for (int i = 0; i < 6; ++i) {
      std::vector<int32_t> base(size_t(page_size * (2 + int32_t(rng_() % 7))));
      for (int32_t& t : base) t = tok(rng_);
      bases_.push_back(std::move(base));
    }
  }

  void run(int steps) {
    for (int i = 0; i < steps; ++i) {
      step();
      check();
      if (::testing::Test::HasFailure()) return;  // the first broken invariant is the story
    }
    while (!reqs_.empty()) finish(0);
    hc_.wait_all();
    check();
  }

  HiCacheStats stats() const { return hc_.stats(); }

 private:
  void step() {
    const uint32_t op = rng_() % 100;
    if (op < 30) {
      if (reqs_.size() < 3) start();
    } else if (op < 55) {
      if (!reqs_.empty()) compute(rng_() % reqs_.size());
    } else if (op < 80) {
      if (!reqs_.empty()) finish(rng_() % reqs_.size());
    } else if (op < 84) {
      hc_.evict_device(1 + int32_t(rng_() % 6));
    } else if (op < 88) {
      hc_.evict_ahead(1 + int32_t(rng_() % 12));
    } else if (op < 94) {
      hc_.poll();
    } else if (op < 99) {
      hc_.wait_all();
      verify_all();
    } else if (reqs_.empty()) {
      ASSERT_TRUE(cache_.reset());
      ASSERT_TRUE(hc_.reset());
    }
  }

  std::vector<int32_t> make_tokens() {
    std::vector<int32_t> t = bases_[rng_() % bases_.size()];
    if (rng_() % 3 == 0) t.resize(size_t(ps_) * (1 + rng_() % (t.size() / size_t(ps_))));
    const int32_t extra = int32_t(rng_() % size_t(3 * ps_ + 1)) + 1;
    for (int32_t i = 0; i < extra; ++i) t.push_back(int32_t(rng_() % 41));
    return t;
  }

  // Admission: lock the device match, extend it from host, check what the request reads.
  void start() {
    Req r;
    r.tokens = make_tokens();
    const int32_t limit = int32_t(r.tokens.size()) - 1;  // the last token is always computed
    std::span<const int32_t> key(r.tokens.data(), size_t(limit));
    RadixMatch m = cache_.match_prefix(key);
    cache_.inc_lock_ref(m.node);
    hc_.on_match(key, m.matched_tokens);
    const int32_t promoted = hc_.promote(key, m.matched_tokens, limit);
    if (promoted > 0) {
      RadixMatch m2 = cache_.match_prefix(key, false);
      ASSERT_GE(m2.matched_tokens, m.matched_tokens + promoted);
      cache_.inc_lock_ref(m2.node);
      cache_.dec_lock_ref(m.node);
      m = std::move(m2);
    }
    hc_.wait_promotions();
    pool_.retain(m.pages);
    r.node = m.node;
    r.pages = m.pages;
    r.cached_pages = int32_t(m.pages.size());
    r.kv_len = m.matched_tokens;
    for (int32_t i = 0; i < r.cached_pages; ++i)
      ASSERT_EQ(content_[size_t(r.pages[size_t(i)])], signature(r.tokens, i, ps_))
          << "page " << i << " of a matched prefix holds the wrong tokens";
    reqs_.push_back(std::move(r));
  }

  // A prefill step: pages for every token, "compute" them, cache the full pages.
  void compute(size_t i) {
    Req& r = reqs_[i];
    const int32_t len = int32_t(r.tokens.size());
    if (r.kv_len == len) return;
    const int32_t need = (len + ps_ - 1) / ps_ - int32_t(r.pages.size());
    if (pool_.num_free_pages() < need) hc_.evict_device(need - pool_.num_free_pages());
    if (pool_.num_free_pages() < need) return;  // the pool is full of locked prefixes: wait
    ASSERT_TRUE(pool_.allocate_into(need, &r.pages));
    for (int32_t p = r.kv_len / ps_; p < int32_t(r.pages.size()); ++p)
      if ((p + 1) * ps_ <= len) content_[size_t(r.pages[size_t(p)])] = signature(r.tokens, p, ps_);
    r.kv_len = len;
    const int32_t full = len / ps_;
    if (full <= r.cached_pages) return;
    std::span<const int32_t> key(r.tokens.data(), size_t(full * ps_));
    cache_.insert(key, std::span(r.pages).first(size_t(full)));
    hc_.on_insert(key);
    RadixMatch m = cache_.match_prefix(key, false);
    ASSERT_EQ(m.matched_tokens, full * ps_);
    pool_.retain(m.pages);
    std::copy(m.pages.begin(), m.pages.end(), r.pages.begin());
    cache_.inc_lock_ref(m.node);
    cache_.dec_lock_ref(r.node);
    r.node = m.node;
    r.cached_pages = full;
  }

  void finish(size_t i) {
    Req& r = reqs_[i];
    for (int32_t p = 0; p < r.kv_len / ps_; ++p)
      ASSERT_EQ(content_[size_t(r.pages[size_t(p)])], signature(r.tokens, p, ps_))
          << "locked page lost";
    pool_.release(std::span(r.pages).subspan(size_t(r.cached_pages)));
    pool_.release(std::span(r.pages).first(size_t(r.cached_pages)));
    cache_.dec_lock_ref(r.node);
    reqs_.erase(reqs_.begin() + std::ptrdiff_t(i));
  }

  // After every copy landed: every cached device prefix holds its own tokens.
  void verify_all() {
    for (const auto& base : bases_) {
      RadixMatch m = cache_.match_prefix(base, false);
      for (size_t p = 0; p < m.pages.size(); ++p)
        ASSERT_EQ(content_[size_t(m.pages[p])], signature(base, int32_t(p), ps_));
    }
  }

  void check() {
    pool_.check_invariants();
    cache_.check_invariants();
    hc_.check_invariants();
    std::vector<int32_t> holders(size_t(pool_.num_pages()), 0);
    cache_.for_each_page([&](PageId p) { ++holders[size_t(p)]; });
    hc_.for_each_held_device_page([&](PageId p) { ++holders[size_t(p)]; });
    for (const Req& r : reqs_) {
      std::unordered_set<PageId> own(r.pages.begin(), r.pages.end());
      ASSERT_EQ(own.size(), r.pages.size()) << "a request holds a page twice";
      for (PageId p : r.pages) ++holders[size_t(p)];
      // Locked prefixes stay whole: the path is the request's prefix.
      std::vector<PageId> path = cache_.path_pages(r.node);
      ASSERT_EQ(int32_t(path.size()), r.cached_pages);
      ASSERT_TRUE(std::equal(path.begin(), path.end(), r.pages.begin()));
      if (r.cached_pages > 0) ASSERT_GE(cache_.lock_ref(r.node), 1);
    }
    for (PageId p = 0; p < pool_.num_pages(); ++p)
      ASSERT_EQ(pool_.refcount(p), holders[size_t(p)]) << "device page " << p;
    ASSERT_LE(host_.num_pages() - host_.num_free_pages(), host_.num_pages());
    ASSERT_EQ(host_.cached_pages(), host_.num_pages() - host_.num_free_pages());
  }

  std::mt19937 rng_;
  int32_t ps_;
  PagePool pool_;
  RadixCache cache_;
  HostPool host_;
  std::vector<uint64_t> content_;  // [device pages] signature of the tokens a page holds
  FakeIo io_;
  HiCache hc_;
  std::vector<std::vector<int32_t>> bases_;
  std::vector<Req> reqs_;
};

struct Case {
  HiCacheWritePolicy policy;
  int32_t page_size;
};

class HiCacheRandomTest : public ::testing::TestWithParam<Case> {};

TEST_P(HiCacheRandomTest, InvariantsHoldAcrossBothTiers) {
  const Case c = GetParam();
  int64_t promoted = 0, demoted = 0;
  for (uint32_t seed : {1u, 2u, 3u, 4u}) {
    SCOPED_TRACE(seed);
    Harness h(seed, c.policy, c.page_size, /*device_pages=*/40, /*host_pages=*/48);
    h.run(3000);
    if (HasFailure()) return;
    promoted += h.stats().promoted_pages;
    demoted += h.stats().demoted_pages;
  }
  // The workload reuses prefixes beyond the device pool, so the host tier must be used.
  EXPECT_GT(promoted, 0);
  EXPECT_GT(demoted, 0);
}

INSTANTIATE_TEST_SUITE_P(
    Policies, HiCacheRandomTest,
    ::testing::Values(Case{HiCacheWritePolicy::kWriteThrough, 1},
                      Case{HiCacheWritePolicy::kWriteThrough, 4},
                      Case{HiCacheWritePolicy::kWriteThroughSelective, 1},
                      Case{HiCacheWritePolicy::kWriteThroughSelective, 4},
                      Case{HiCacheWritePolicy::kWriteBack, 1},
                      Case{HiCacheWritePolicy::kWriteBack, 4}),
    // Readable, stable names (the default prints the struct's bytes, padding included, so ctest's
    // discovered names could differ from the run's and a filter would then match nothing).
    [](const ::testing::TestParamInfo<Case>& info) {
      return std::string(hicache_write_policy_name(info.param.policy)) + "_page" +
             std::to_string(info.param.page_size);
    });

TEST(HiCachePolicyTest, ParsesPolicies) {
  EXPECT_EQ(*parse_hicache_write_policy("write_back"), HiCacheWritePolicy::kWriteBack);
  EXPECT_EQ(*parse_hicache_write_policy("write_through"), HiCacheWritePolicy::kWriteThrough);
  EXPECT_EQ(*parse_hicache_write_policy("write_through_selective"),
            HiCacheWritePolicy::kWriteThroughSelective);
  auto bad = parse_hicache_write_policy("write_around");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--hicache-write-policy"), std::string::npos);
}

// The fixed scenarios' setup: a device pool and its tree, a host pool, the late copier (page
// contents are signatures) and the tier over them.
struct Tiers {
  Tiers(uint32_t seed, HiCacheWritePolicy policy, int32_t page_size, int32_t device_pages,
        int32_t host_pages, testing::LateCopierShape shape = kSignaturePages)
      : rng(seed),
        pool(device_pages, page_size),
        cache(&pool),
        host(host_pages, page_size),
        content(size_t(device_pages), 0),
        io(&content, host_pages, shape, &rng),
        hc(&pool, &cache, &host, &io, policy) {}
  std::mt19937 rng;
  PagePool pool;
  RadixCache cache;
  HostPool host;
  std::vector<uint64_t> content;  // [device pages]
  FakeIo io;
  HiCache hc;
};

// Fixed scenario: a prefix evicted from the device comes back from host with its pages' bytes.
TEST(HiCacheTest, WriteBackDemotesOnEvictionAndPromotesOnMatch) {
  Tiers t(7, HiCacheWritePolicy::kWriteBack, /*page_size=*/2, /*device_pages=*/4, /*host_pages=*/8);
  auto& [rng, pool, cache, host, content, io, hc] = t;
  const std::vector<int32_t> a = {1, 2, 3, 4, 5, 6};
  std::vector<PageId> pages = *pool.allocate(3);
  for (int p = 0; p < 3; ++p) content[size_t(pages[size_t(p)])] = signature(a, p, 2);
  cache.insert(a, pages);
  EXPECT_EQ(host.cached_pages(), 0);  // write_back: nothing copied yet
  EXPECT_EQ(hc.evict_device(4), 3);
  EXPECT_EQ(pool.num_free_pages(), 4);
  EXPECT_EQ(host.cached_pages(), 3);
  EXPECT_EQ(hc.stats().demoted_pages, 3);
  std::fill(content.begin(), content.end(), 0);

  RadixMatch m = cache.match_prefix(a);
  ASSERT_EQ(m.matched_tokens, 0);
  cache.inc_lock_ref(m.node);
  EXPECT_EQ(hc.promote(a, 0, 5), 4);  // up to 5 tokens: two whole pages
  hc.wait_promotions();
  cache.dec_lock_ref(m.node);
  RadixMatch m2 = cache.match_prefix(a);
  ASSERT_EQ(m2.matched_tokens, 4);
  for (int p = 0; p < 2; ++p) EXPECT_EQ(content[size_t(m2.pages[size_t(p)])], signature(a, p, 2));
  EXPECT_EQ(hc.stats().host_hit_tokens, 4);
  EXPECT_EQ(hc.stats().bytes_to_device, 200);
  EXPECT_EQ(hc.stats().bytes_to_host, 300);
}

// write_back: evict_ahead() demotes without waiting; the pages stay held by their copies (pending
// free) until an allocation's evict_device() waits for them.
TEST(HiCacheTest, WriteBackEvictsAheadWithoutWaiting) {
  // Copies land only when waited for (done() almost never lands one).
  Tiers t(11, HiCacheWritePolicy::kWriteBack, /*page_size=*/2, /*device_pages=*/5, /*host_pages=*/8,
          {.slots_per_page = 1, .page_bytes = 100, .land_one_in = 1u << 30});
  auto& [rng, pool, cache, host, content, io, hc] = t;
  const std::vector<int32_t> a = {1, 2, 3, 4, 5, 6}, b = {7, 8};
  std::vector<PageId> pa = *pool.allocate(3);
  for (int p = 0; p < 3; ++p) content[size_t(pa[size_t(p)])] = signature(a, p, 2);
  cache.insert(a, pa);
  cache.insert(b, *pool.allocate(1));
  ASSERT_EQ(pool.num_free_pages(), 1);

  hc.evict_ahead(3);  // 1 free: two more pages, the LRU leaf first (a's last page, or b)
  EXPECT_EQ(pool.num_free_pages(), 1) << "evict_ahead waited for its copies";
  EXPECT_GE(hc.pages_pending_free(), 2);
  const int32_t ahead = int32_t(hc.stats().evicted_ahead_pages);
  EXPECT_GE(ahead, 2);
  EXPECT_EQ(hc.pages_pending_free(), ahead);
  hc.check_invariants();
  hc.evict_ahead(3);  // free + pending already reach the target: nothing more
  EXPECT_EQ(hc.stats().evicted_ahead_pages, ahead);

  // An allocation of 1 + ahead pages takes the pending ones first: waits, evicts nothing more.
  EXPECT_EQ(hc.evict_device(ahead), ahead);
  EXPECT_EQ(pool.num_free_pages(), 1 + ahead);
  EXPECT_EQ(hc.pages_pending_free(), 0);
  EXPECT_EQ(hc.stats().demoted_pages, ahead);
  EXPECT_EQ(cache.evictable_pages(), 4 - ahead);
  hc.check_invariants();

  // Other policies copied at insert time: nothing to overlap, evict_ahead leaves the tree alone.
  Tiers wt(12, HiCacheWritePolicy::kWriteThrough, /*page_size=*/2, /*device_pages=*/4,
           /*host_pages=*/8);
  wt.cache.insert(a, *wt.pool.allocate(3));
  wt.hc.evict_ahead(4);
  EXPECT_EQ(wt.cache.evictable_pages(), 3);
  EXPECT_EQ(wt.hc.stats().evicted_ahead_pages, 0);
}

TEST(HiCacheTest, WriteThroughDropsNothingItBackedUpAndHostEvictsLru) {
  Tiers tiers(9, HiCacheWritePolicy::kWriteThrough, /*page_size=*/1, /*device_pages=*/8,
              /*host_pages=*/3);
  auto& [rng, pool, cache, host, content, io, hc] = tiers;
  for (int32_t first : {10, 20, 30}) {
    const std::vector<int32_t> t = {first, first + 1};
    cache.insert(t, *pool.allocate(2));
    hc.on_insert(t);
    hc.wait_all();  // copies in flight lock their host prefixes; landed ones are evictable
  }
  // Three host pages hold one two-page prefix: each backup evicted the older one (LRU).
  EXPECT_EQ(host.cached_pages(), 2);
  EXPECT_EQ(host.peek(std::vector<int32_t>{30, 31}).matched_tokens, 2);
  EXPECT_EQ(host.peek(std::vector<int32_t>{20, 21}).matched_tokens, 0);
  EXPECT_EQ(host.peek(std::vector<int32_t>{10, 11}).matched_tokens, 0);
  EXPECT_EQ(hc.evict_device(8), 6);
  EXPECT_EQ(hc.stats().backed_up_pages, 6);
  EXPECT_EQ(hc.stats().demoted_pages, 2);  // write_through: only what the host holds survives
  EXPECT_EQ(hc.stats().dropped_pages, 4);
  EXPECT_EQ(hc.stats().bytes_to_host, 600);
  hc.check_invariants();
}

}  // namespace
}  // namespace strata
