#include "kv/page_pool.h"

#include "core/check.h"

namespace strata {

PagePool::PagePool(int32_t num_pages, int32_t page_size)
    : page_size_(page_size), refcount_(num_pages, 0) {
  CHECK_GE(num_pages, 0);
  CHECK_GE(page_size, 1);
  free_list_.reserve(num_pages);
  // Pushed in reverse so that the first allocation hands out pages 0, 1, 2, ...
  for (PageId p = num_pages - 1; p >= 0; --p) free_list_.push_back(p);
}

std::optional<std::vector<PageId>> PagePool::allocate(int32_t n) {
  std::vector<PageId> out;
  if (!allocate_into(n, &out)) return std::nullopt;
  return out;
}

bool PagePool::allocate_into(int32_t n, std::vector<PageId>* out) {
  CHECK_GE(n, 0);
  if (n > num_free_pages()) return false;
  out->reserve(out->size() + n);
  for (int32_t i = 0; i < n; ++i) {
    PageId p = free_list_.back();
    free_list_.pop_back();
    CHECK_EQ(refcount_[p], 0);
    refcount_[p] = 1;
    out->push_back(p);
  }
  return true;
}

void PagePool::check_id(PageId page) const {
  CHECK_MSG(page >= 0 && page < num_pages(), "page {} outside the pool of {}", page, num_pages());
}

void PagePool::retain(PageId page) {
  check_id(page);
  CHECK_MSG(refcount_[page] > 0, "retain of free page {}", page);
  ++refcount_[page];
}

void PagePool::retain(std::span<const PageId> pages) {
  for (PageId p : pages) retain(p);
}

void PagePool::release(PageId page) {
  check_id(page);
  CHECK_MSG(refcount_[page] > 0, "release of free page {}", page);
  if (--refcount_[page] == 0) free_list_.push_back(page);
}

void PagePool::release(std::span<const PageId> pages) {
  for (PageId p : pages) release(p);
}

int32_t PagePool::refcount(PageId page) const {
  check_id(page);
  return refcount_[page];
}

void PagePool::check_invariants() const {
  std::vector<char> on_free_list(num_pages(), 0);
  for (PageId p : free_list_) {
    check_id(p);
    CHECK_MSG(!on_free_list[p], "page {} twice on the free list", p);
    on_free_list[p] = 1;
  }
  int32_t used = 0;
  for (PageId p = 0; p < num_pages(); ++p) {
    CHECK_MSG(refcount_[p] >= 0, "page {} refcount {}", p, refcount_[p]);
    CHECK_MSG((refcount_[p] == 0) == (on_free_list[p] != 0), "page {} refcount {} free-listed {}",
              p, refcount_[p], int{on_free_list[p]});
    used += refcount_[p] > 0;
  }
  CHECK_EQ(used, num_used_pages());
  CHECK_EQ(num_free_pages() + num_used_pages(), num_pages());
}

}  // namespace strata
