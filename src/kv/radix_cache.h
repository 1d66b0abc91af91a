// RadixCache: a radix tree over token-id sequences that maps cached prefixes to KV pages, with lock
// references while requests use a prefix and LRU eviction of unlocked leaves (SGLang's RadixCache).
//
// Granularity is the page: only full pages are cached, so every node's key holds a multiple of
// page_size tokens and one page per page_size tokens (page_size 1 caches every token).
//
// Page ownership: the tree holds one pool reference per page it stores. match_prefix() neither
// retains nor locks; a request that uses a matched prefix locks its node (inc_lock_ref) and, if it
// puts the pages in its page table, retains them itself. insert() consumes one caller reference per
// page: pages new to the tree are adopted, pages whose tokens were already cached are released (the
// caller switches to the tree's pages via a fresh match_prefix). evict() drops the tree's
// reference.
//
// Host-tier seam: set_evict_hook() sees every node just before its pages are released, with the
// full token path, so a host tier can copy the pages out and keep the prefix.
//
// Owned and called by the engine thread only; not thread-safe. match/insert cost O(tokens);
// evict costs O(nodes) to collect leaves plus O(evicted log leaves).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "kv/page_pool.h"

namespace strata {

struct RadixNode;  // defined in radix_cache.cc; opaque to callers
using RadixNodeHandle = RadixNode*;

struct RadixMatch {
  int32_t matched_tokens = 0;      // a multiple of page_size
  std::vector<PageId> pages;       // [matched_tokens / page_size], in sequence order
  RadixNodeHandle node = nullptr;  // the node whose end is the match end (the root when empty)
};

// What a caller needs to know before committing to a prefix, without touching the tree.
struct RadixPeek {
  int32_t matched_tokens = 0;
  int32_t evictable_pages = 0;  // matched pages now in unlocked nodes: locking the match removes
                                // them from evictable_pages()
};

struct RadixCacheStats {
  int64_t lookup_tokens = 0;    // tokens passed to match_prefix(record_stats = true)
  int64_t hit_tokens = 0;       // of which were found in the cache
  int64_t inserted_pages = 0;   // pages adopted by insert()
  int64_t evicted_pages = 0;    // pages released by evict()
  int32_t cached_pages = 0;     // pages in the tree now
  int32_t evictable_pages = 0;  // of which in unlocked nodes
  int32_t locked_pages = 0;     // of which in locked nodes
};

// Called for every evicted node before its pages are released.
struct EvictedNode {
  std::span<const int32_t> path_tokens;  // tokens from the root to the end of this node
  int32_t first_token = 0;               // index in path_tokens of the node's first token
  std::span<const PageId> pages;         // the node's pages: path_tokens[first_token:]
  RadixNodeHandle parent = nullptr;      // still cached: path_pages(parent) gives the pages
                                         // of path_tokens[:first_token] (the root when 0)
};
using EvictHook = std::function<void(const EvictedNode&)>;

class RadixCache {
 public:
  explicit RadixCache(PagePool* pool);
  ~RadixCache();
  RadixCache(const RadixCache&) = delete;
  RadixCache& operator=(const RadixCache&) = delete;

  int32_t page_size() const { return page_size_; }
  RadixNodeHandle root() const { return root_.get(); }

  // Longest cached prefix of tokens, rounded down to whole pages. Splits a node when the match
  // ends inside it, so that the returned node can be locked exactly. Refreshes LRU times on the
  // path.
  RadixMatch match_prefix(std::span<const int32_t> tokens, bool record_stats = true);
  // The same match length without side effects (for scheduler snapshots).
  RadixPeek peek_prefix(std::span<const int32_t> tokens) const;

  // Caches tokens (tokens.size() == pages.size() * page_size) and consumes the caller's reference
  // on every page (see the header comment). Returns how many leading tokens were already cached.
  int32_t insert(std::span<const int32_t> tokens, std::span<const PageId> pages);

  // Lock references: a locked node and its ancestors are never evicted. Every inc has one dec.
  void inc_lock_ref(RadixNodeHandle node);
  void dec_lock_ref(RadixNodeHandle node);
  int32_t lock_ref(RadixNodeHandle node) const;
  // Pages of the node and its ancestors locked by exactly one holder: what would become evictable
  // if that one holder (locked at `node`) unlocked.
  int32_t exclusive_locked_pages(RadixNodeHandle node) const;
  // Pages from the root to the end of node, in sequence order; tokens on that path.
  std::vector<PageId> path_pages(RadixNodeHandle node) const;
  int32_t path_tokens(RadixNodeHandle node) const;

  // Evicts least-recently-used unlocked leaves until at least num_pages pages were released or
  // nothing evictable remains. Whole nodes are evicted, so it may release more. Returns the count.
  int32_t evict(int32_t num_pages);

  int32_t cached_pages() const { return cached_pages_; }
  int32_t evictable_pages() const { return cached_pages_ - locked_pages_; }
  int32_t locked_pages() const { return locked_pages_; }
  RadixCacheStats stats() const;

  // Drops every cached prefix (releasing the tree's references). Refuses and returns false while
  // any node below the root is locked. Statistics counters are kept.
  bool reset();

  void set_evict_hook(EvictHook hook) { evict_hook_ = std::move(hook); }

  // Visits every cached page (for invariant checks of the owners above).
  void for_each_page(const std::function<void(PageId)>& fn) const;
  // CHECKs the tree's structure, page counts, lock references, and that every cached page is
  // unique and held in the pool. O(nodes + pages).
  void check_invariants() const;

 private:
  RadixNode* split(RadixNode* node, int32_t split_tokens);
  void remove_leaf(RadixNode* leaf);
  RadixNode* find_child(const RadixNode* node, std::span<const int32_t> tokens) const;

  PagePool* pool_;
  int32_t page_size_;
  std::unique_ptr<RadixNode> root_;
  uint64_t clock_ = 0;  // LRU time: a counter, so eviction order is deterministic
  int32_t cached_pages_ = 0;
  int32_t locked_pages_ = 0;
  int64_t lookup_tokens_ = 0;
  int64_t hit_tokens_ = 0;
  int64_t inserted_pages_ = 0;
  int64_t evicted_pages_ = 0;
  EvictHook evict_hook_;
};

}  // namespace strata
