#include "kv/host_pool.h"

#include <algorithm>

#include "core/check.h"

namespace strata {

HostPool::HostPool(int32_t num_pages, int32_t page_size)
    : pages_(num_pages, page_size), tree_(&pages_) {}

std::vector<PageId> HostPool::allocate_up_to(int32_t n) {
  std::vector<PageId> out;
  if (n <= 0) return out;
  if (pages_.num_free_pages() < n) tree_.evict(n - pages_.num_free_pages());
  pages_.allocate_into(std::min(n, pages_.num_free_pages()), &out);
  return out;
}

RadixNodeHandle HostPool::insert(std::span<const int32_t> tokens, std::span<const PageId> pages) {
  tree_.insert(tokens, pages);
  RadixMatch m = tree_.match_prefix(tokens, false);
  CHECK_EQ(size_t(m.matched_tokens), tokens.size());
  return m.node;
}

void HostPool::check_invariants() const {
  pages_.check_invariants();
  tree_.check_invariants();
  std::vector<int32_t> holders(size_t(pages_.num_pages()), 0);
  tree_.for_each_page([&](PageId p) { ++holders[size_t(p)]; });
  for (PageId p = 0; p < pages_.num_pages(); ++p)
    CHECK_MSG(pages_.refcount(p) == holders[size_t(p)], "host page {}: refcount {} but {} holders",
              p, pages_.refcount(p), holders[size_t(p)]);
  CHECK_LE(pages_.num_used_pages(), pages_.num_pages());
  CHECK_EQ(tree_.cached_pages(), pages_.num_used_pages());
}

}  // namespace strata
