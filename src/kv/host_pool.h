// HostPool: the pages of the host KV tier and the radix tree of the prefixes they hold. Policy-
// free metadata (which page holds which tokens, LRU, locks); the bytes live in the backend's host
// mirror (backend/kv_host_io.h) and the policy that moves pages between tiers is kv/hicache.h.
//
// The tree is a RadixCache over host page ids, so it is prefix-closed: a cached host prefix holds
// every page from the root to its end. Every allocated host page is held by the tree exactly
// once, except between allocate() and insert() inside one call of the host tier.
//
// Engine thread only; not thread-safe. Costs as RadixCache's (O(tokens) per match/insert).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kv/page_pool.h"
#include "kv/radix_cache.h"

namespace strata {

class HostPool {
 public:
  HostPool(int32_t num_pages, int32_t page_size);

  int32_t num_pages() const { return pages_.num_pages(); }
  int32_t page_size() const { return pages_.page_size(); }
  int64_t capacity_tokens() const { return pages_.capacity_tokens(); }
  int32_t num_free_pages() const { return pages_.num_free_pages(); }
  int32_t cached_pages() const { return tree_.cached_pages(); }
  int32_t locked_pages() const { return tree_.locked_pages(); }
  int64_t evicted_pages() const { return tree_.stats().evicted_pages; }

  // Longest host prefix of tokens (whole pages); refreshes LRU times on the path.
  RadixMatch match(std::span<const int32_t> tokens) { return tree_.match_prefix(tokens, false); }
  RadixPeek peek(std::span<const int32_t> tokens) const { return tree_.peek_prefix(tokens); }

  // Up to n fresh pages (refcount 1 each), evicting least-recently-used unlocked host prefixes
  // when the free list is short. Fewer (possibly none) when locked prefixes fill the tier.
  std::vector<PageId> allocate_up_to(int32_t n);
  // Caches tokens (a whole path from the root) on pages; consumes one reference per page like
  // RadixCache::insert (pages already cached there are released). Returns the node at the end.
  RadixNodeHandle insert(std::span<const int32_t> tokens, std::span<const PageId> pages);
  void retain(std::span<const PageId> pages) { pages_.retain(pages); }
  void release(std::span<const PageId> pages) { pages_.release(pages); }

  // Locked host prefixes (and their ancestors) are never evicted: copies in flight hold one.
  void lock(RadixNodeHandle node) { tree_.inc_lock_ref(node); }
  void unlock(RadixNodeHandle node) { tree_.dec_lock_ref(node); }
  int32_t lock_ref(RadixNodeHandle node) const { return tree_.lock_ref(node); }
  RadixNodeHandle root() const { return tree_.root(); }

  // Drops every host prefix; false (nothing dropped) while any is locked.
  bool reset() { return tree_.reset(); }

  void for_each_page(const std::function<void(PageId)>& fn) const { tree_.for_each_page(fn); }
  // CHECKs the pool and tree invariants, that every used page is held by the tree exactly once,
  // and that used pages never exceed the capacity. O(pages).
  void check_invariants() const;

 private:
  PagePool pages_;
  RadixCache tree_;
};

}  // namespace strata
