// PagePool: the ids, refcounts and free list of the KV pages of one GPU rank. Metadata only: the
// device memory the ids index is owned by the backend. Each holder of a page (the radix cache, a
// running request) owns one reference; a page returns to the free list when its last reference
// is released.
//
// Owned and called by the engine thread only; not thread-safe. Every operation is O(pages touched).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace strata {

using PageId = int32_t;

class PagePool {
 public:
  // num_pages pages of page_size tokens each; all free.
  PagePool(int32_t num_pages, int32_t page_size);

  int32_t num_pages() const { return static_cast<int32_t>(refcount_.size()); }
  int32_t page_size() const { return page_size_; }
  int64_t capacity_tokens() const { return int64_t{num_pages()} * page_size_; }
  int32_t num_free_pages() const { return static_cast<int32_t>(free_list_.size()); }
  int32_t num_used_pages() const { return num_pages() - num_free_pages(); }
  // Pages needed to hold `tokens` tokens.
  int64_t pages_for_tokens(int64_t tokens) const { return (tokens + page_size_ - 1) / page_size_; }

  // All-or-nothing: n pages with refcount 1 each, or nullopt when fewer than n are free (the pool
  // is then unchanged). n == 0 gives an empty vector.
  std::optional<std::vector<PageId>> allocate(int32_t n);
  // As allocate, appending to *out; returns false (and leaves *out alone) when fewer than n are
  // free.
  bool allocate_into(int32_t n, std::vector<PageId>* out);

  // Adds a holder to a page in use. CHECKs the page is allocated.
  void retain(PageId page);
  void retain(std::span<const PageId> pages);
  // Drops a holder; the page is freed when none remain. CHECKs the page is allocated.
  void release(PageId page);
  void release(std::span<const PageId> pages);

  int32_t refcount(PageId page) const;

  // CHECKs: refcount >= 0; a page is on the free list exactly when its refcount is 0, and at most
  // once; free + used == num_pages. O(num_pages); for tests and debug builds.
  void check_invariants() const;

 private:
  void check_id(PageId page) const;

  int32_t page_size_;
  std::vector<int32_t> refcount_;  // [num_pages]
  std::vector<PageId>
      free_list_;  // LIFO stack of free page ids (recently freed pages reused first)
};

}  // namespace strata
