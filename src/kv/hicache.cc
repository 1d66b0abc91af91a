#include "kv/hicache.h"

#include <algorithm>

#include "core/check.h"

namespace strata {
namespace {

constexpr size_t kMaxHitCounts = size_t(1) << 16;  // forget old counts beyond this many prefixes

uint64_t hash_tokens(std::span<const int32_t> tokens) {
  uint64_t h = 0xcbf29ce484222325ULL ^ tokens.size();
  for (int32_t t : tokens) {
    h ^= static_cast<uint32_t>(t);
    h *= 0x100000001b3ULL;
  }
  return h;
}

}  // namespace

HiCache::HiCache(PagePool* device_pool, RadixCache* device_cache, HostPool* host, HiCacheIo* io,
                 HiCacheWritePolicy policy)
    : device_pool_(device_pool),
      device_cache_(device_cache),
      host_(host),
      io_(io),
      policy_(policy),
      page_size_(device_pool->page_size()) {
  CHECK_EQ(host_->page_size(), page_size_);
  CHECK_EQ(device_cache_->page_size(), page_size_);
  device_cache_->set_evict_hook([this](const EvictedNode& n) { on_device_evict(n); });
}

HiCache::~HiCache() {
  wait_all();
  device_cache_->set_evict_hook(nullptr);
}

int32_t HiCache::backup(std::span<const int32_t> tokens, std::span<const PageId> device_pages) {
  CHECK_EQ(tokens.size(), device_pages.size() * size_t(page_size_));
  RadixMatch hm = host_->match(tokens);
  if (size_t(hm.matched_tokens) == tokens.size()) return hm.matched_tokens;
  // The matched host prefix must survive the host evictions that make room for the rest.
  host_->lock(hm.node);
  const int32_t want = int32_t(tokens.size() / size_t(page_size_)) - hm.matched_tokens / page_size_;
  std::vector<PageId> fresh = host_->allocate_up_to(want);
  host_->unlock(hm.node);
  if (fresh.empty()) return hm.matched_tokens;
  const int32_t first = hm.matched_tokens / page_size_;
  const int32_t n = int32_t(fresh.size());
  std::vector<PageCopy> copies;
  copies.reserve(fresh.size());
  for (int32_t i = 0; i < n; ++i)
    copies.push_back({device_pages[size_t(first + i)], fresh[size_t(i)]});
  const uint64_t ticket = io_->device_to_host(copies);

  const int32_t end = hm.matched_tokens + n * page_size_;
  std::vector<PageId> path = hm.pages;
  host_->retain(path);  // insert() releases the caller's reference on pages already cached
  path.insert(path.end(), fresh.begin(), fresh.end());
  RadixNodeHandle node = host_->insert(tokens.first(size_t(end)), path);
  host_->lock(node);
  std::vector<PageId> held(device_pages.begin() + first, device_pages.begin() + first + n);
  device_pool_->retain(held);
  in_flight_.push_back(
      InFlight{.ticket = ticket, .host_node = node, .device_pages = std::move(held)});
  stats_.backed_up_pages += n;
  stats_.bytes_to_host += int64_t(n) * io_->page_bytes();
  return end;
}

void HiCache::backup_device_path(std::span<const int32_t> tokens) {
  RadixMatch dm = device_cache_->match_prefix(tokens, /*record_stats=*/false);
  if (dm.matched_tokens == 0) return;
  backup(tokens.first(size_t(dm.matched_tokens)), dm.pages);
}

void HiCache::on_device_evict(const EvictedNode& e) {
  const int32_t total = int32_t(e.path_tokens.size());
  const int32_t leaf_pages = int32_t(e.pages.size());
  // Matching (not peeking) refreshes the host LRU: a demoted prefix is the host's newest.
  int32_t held = host_->match(e.path_tokens).matched_tokens;
  if (held < total && policy_ == HiCacheWritePolicy::kWriteBack) {
    std::vector<PageId> pages = device_cache_->path_pages(e.parent);
    pages.insert(pages.end(), e.pages.begin(), e.pages.end());
    held = backup(e.path_tokens, pages);
  }
  const int32_t kept = std::clamp((held - e.first_token) / page_size_, 0, leaf_pages);
  stats_.demoted_pages += kept;
  stats_.dropped_pages += leaf_pages - kept;
  if (kept == leaf_pages) ++stats_.demotions;
}

int32_t HiCache::promote(std::span<const int32_t> tokens, int32_t device_tokens,
                         int32_t max_tokens) {
  poll();
  max_tokens = std::min<int32_t>(max_tokens, int32_t(tokens.size())) / page_size_ * page_size_;
  if (max_tokens <= device_tokens) return 0;
  if (host_->peek(tokens.first(size_t(max_tokens))).matched_tokens <= device_tokens) return 0;
  RadixMatch hm = host_->match(tokens.first(size_t(max_tokens)));
  host_->lock(hm.node);  // the source pages stay through the device evictions below
  const int32_t want = (hm.matched_tokens - device_tokens) / page_size_;
  if (device_pool_->num_free_pages() < want) evict_device(want - device_pool_->num_free_pages());
  const int32_t n = std::min(want, device_pool_->num_free_pages());
  if (n == 0) {
    host_->unlock(hm.node);
    return 0;
  }
  std::vector<PageId> fresh = *device_pool_->allocate(n);
  const int32_t first = device_tokens / page_size_;
  std::vector<PageCopy> copies;
  copies.reserve(size_t(n));
  for (int32_t i = 0; i < n; ++i) copies.push_back({fresh[size_t(i)], hm.pages[size_t(first + i)]});
  const uint64_t ticket = io_->host_to_device(copies);
  last_promotion_ticket_ = ticket;

  // Extend the device path: its existing pages (retained: insert releases pages already cached)
  // plus the promoted ones (one reference for the tree, one for the copy in flight).
  RadixMatch dm =
      device_cache_->match_prefix(tokens.first(size_t(device_tokens)), /*record_stats=*/false);
  CHECK_EQ(dm.matched_tokens, device_tokens);
  device_pool_->retain(dm.pages);
  device_pool_->retain(fresh);
  std::vector<PageId> path = dm.pages;
  path.insert(path.end(), fresh.begin(), fresh.end());
  const int32_t end = device_tokens + n * page_size_;
  device_cache_->insert(tokens.first(size_t(end)), path);
  in_flight_.push_back(
      InFlight{.ticket = ticket, .host_node = hm.node, .device_pages = std::move(fresh)});
  ++stats_.promotions;
  stats_.promoted_pages += n;
  stats_.host_hit_tokens += int64_t(n) * page_size_;
  stats_.bytes_to_device += int64_t(n) * io_->page_bytes();
  return n * page_size_;
}

void HiCache::wait_promotions() {
  if (last_promotion_ticket_ != 0 && !io_->done(last_promotion_ticket_))
    io_->wait(last_promotion_ticket_);
  poll();
}

void HiCache::on_match(std::span<const int32_t> tokens, int32_t matched_tokens) {
  if (policy_ != HiCacheWritePolicy::kWriteThroughSelective || matched_tokens <= 0) return;
  if (hit_counts_.size() >= kMaxHitCounts) hit_counts_.clear();
  const auto prefix = tokens.first(size_t(matched_tokens));
  if (++hit_counts_[hash_tokens(prefix)] >= 2) backup_device_path(prefix);
}

void HiCache::on_insert(std::span<const int32_t> tokens) {
  if (policy_ == HiCacheWritePolicy::kWriteThrough && !tokens.empty()) backup_device_path(tokens);
}

int32_t HiCache::evict_device(int32_t num_pages) {
  poll();
  // Pages evicted ahead whose copies are still in flight need only the wait below.
  const int32_t pending = pages_pending_free();
  const int32_t released =
      pending + (num_pages > pending ? device_cache_->evict(num_pages - pending) : 0);
  // A copy still reading a page the tree just let go of holds its last reference: wait for it.
  uint64_t need = 0;
  for (const InFlight& f : in_flight_)
    for (PageId p : f.device_pages)
      if (device_pool_->refcount(p) == 1) need = std::max(need, f.ticket);
  if (need != 0) {
    io_->wait(need);
    poll();
  }
  return released;
}

int32_t HiCache::pages_pending_free() const {
  int32_t n = 0;
  for (const InFlight& f : in_flight_)
    for (PageId p : f.device_pages) n += device_pool_->refcount(p) == 1;
  return n;
}

void HiCache::evict_ahead(int32_t target_pages) {
  if (policy_ != HiCacheWritePolicy::kWriteBack) return;
  poll();
  const int32_t have = device_pool_->num_free_pages() + pages_pending_free();
  if (have < target_pages)
    stats_.evicted_ahead_pages += device_cache_->evict(target_pages - have);  // the hook copies
}

void HiCache::poll() {
  while (!in_flight_.empty() && io_->done(in_flight_.front().ticket)) {
    InFlight& f = in_flight_.front();
    host_->unlock(f.host_node);
    device_pool_->release(f.device_pages);
    in_flight_.pop_front();
  }
}

void HiCache::wait_all() {
  if (!in_flight_.empty()) io_->wait(in_flight_.back().ticket);
  poll();
}

bool HiCache::reset() {
  wait_all();
  hit_counts_.clear();
  return host_->reset();
}

void HiCache::for_each_held_device_page(const std::function<void(PageId)>& fn) const {
  for (const InFlight& f : in_flight_)
    for (PageId p : f.device_pages) fn(p);
}

void HiCache::check_invariants() const {
  host_->check_invariants();
  uint64_t prev = 0;
  for (const InFlight& f : in_flight_) {
    CHECK_GT(f.ticket, prev);
    prev = f.ticket;
    CHECK(f.host_node != nullptr && f.host_node != host_->root());
    CHECK_MSG(host_->lock_ref(f.host_node) >= 1, "a host node with a copy in flight is unlocked");
    for (PageId p : f.device_pages)
      CHECK_MSG(device_pool_->refcount(p) >= 1, "device page {} of a copy in flight is free", p);
  }
}

HiCacheStats HiCache::stats() const {
  HiCacheStats s = stats_;
  s.copy_seconds = io_->copy_seconds();
  s.host_evicted_pages = host_->evicted_pages();
  s.host_cached_pages = host_->cached_pages();
  s.host_capacity_pages = host_->num_pages();
  s.copies_in_flight = int32_t(in_flight_.size());
  return s;
}

}  // namespace strata
