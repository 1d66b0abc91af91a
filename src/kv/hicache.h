// HiCache: the hierarchical KV cache policy (design.md §3) — a host tier (HostPool) behind the
// device pool and its radix cache. Prefixes the device evicts are demoted to host instead of
// lost, and a match that the host tier continues past the device match is promoted back.
//
// Write policies (when device pages are copied to host):
//   write_through            every prefix inserted into the device tree is backed up at once;
//   write_through_selective  a prefix is backed up when its device match is hit the second time;
//   write_back               pages are copied when the device evicts them (demotion).
// Under the write-through policies an evicted prefix the host does not hold is dropped, as in
// SGLang; under write_back it is copied first. The host tier evicts LRU unlocked leaves.
//
// Copies go through HiCacheIo (the engine adapts backend/kv_host_io.h), page by page, complete in
// submission order and may be asynchronous. A copy in flight pins what it touches: its host node
// stays locked and its device pages hold one pool reference, so neither is dropped or reused
// before it lands. evict_device() waits for copies whose device pages the eviction would free;
// wait_promotions() is called before a forward pass reads promoted pages. Under write_back,
// evict_ahead() demotes before the pool runs short, so those copies land during a forward pass
// instead of stalling the next allocation (pages_pending_free() counts what they will free).
//
// Engine thread only; not thread-safe. match/insert cost O(tokens); copies O(pages).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/parse_enum.h"
#include "core/status.h"
#include "kv/host_pool.h"
#include "kv/page_pool.h"
#include "kv/radix_cache.h"

namespace strata {

enum class HiCacheWritePolicy : uint8_t { kWriteThrough, kWriteThroughSelective, kWriteBack };
inline constexpr EnumName<HiCacheWritePolicy> kHiCacheWritePolicyNames[] = {
    {HiCacheWritePolicy::kWriteThrough, "write_through"},
    {HiCacheWritePolicy::kWriteThroughSelective, "write_through_selective"},
    {HiCacheWritePolicy::kWriteBack, "write_back"}};
constexpr const auto& enum_names(HiCacheWritePolicy) { return kHiCacheWritePolicyNames; }
// write_through | write_through_selective | write_back; errors name --hicache-write-policy.
inline StatusOr<HiCacheWritePolicy> parse_hicache_write_policy(std::string_view text) {
  return parse_enum<HiCacheWritePolicy>(text, "--hicache-write-policy");
}
inline std::string_view hicache_write_policy_name(HiCacheWritePolicy policy) {
  return enum_name(policy);
}

struct PageCopy {
  PageId device_page = 0;
  PageId host_page = 0;
};

// Moves page bytes between the tiers. Tickets increase; done(t) implies done(every t' < t).
class HiCacheIo {
 public:
  virtual ~HiCacheIo() = default;
  virtual uint64_t device_to_host(std::span<const PageCopy> copies) = 0;
  virtual uint64_t host_to_device(std::span<const PageCopy> copies) = 0;
  virtual bool done(uint64_t ticket) = 0;
  virtual void wait(uint64_t ticket) = 0;
  virtual int64_t page_bytes() const = 0;   // one page, every layer
  virtual double copy_seconds() const = 0;  // of the copies completed so far
};

struct HiCacheStats {
  int64_t host_hit_tokens = 0;  // tokens promoted from host, extending device matches
  int64_t promotions = 0;       // promote() calls that moved pages
  int64_t promoted_pages = 0;
  int64_t demotions = 0;      // evicted device nodes the host kept (in full)
  int64_t demoted_pages = 0;  // evicted device pages the host holds
  int64_t dropped_pages = 0;  // evicted device pages the host does not hold
  int64_t evicted_ahead_pages =
      0;  // of the evicted, by evict_ahead() (before an allocation needed them)
  int64_t backed_up_pages = 0;  // pages copied device -> host (any policy)
  int64_t bytes_to_host = 0;
  int64_t bytes_to_device = 0;
  double copy_seconds = 0;
  int64_t host_evicted_pages = 0;
  int32_t host_cached_pages = 0;
  int32_t host_capacity_pages = 0;
  int32_t copies_in_flight = 0;  // batches not yet retired
};

class HiCache {
 public:
  // Installs the demotion hook on device_cache (removed by the destructor). All pointers must
  // outlive this object; host and device pools share the page size.
  HiCache(PagePool* device_pool, RadixCache* device_cache, HostPool* host, HiCacheIo* io,
          HiCacheWritePolicy policy);
  ~HiCache();
  HiCache(const HiCache&) = delete;
  HiCache& operator=(const HiCache&) = delete;

  HiCacheWritePolicy policy() const { return policy_; }
  const HostPool& host() const { return *host_; }

  // A request holds the device prefix tokens[:device_tokens] locked. Promotes the host tier's
  // continuation up to max_tokens (rounded down to pages) into the device tree: allocates device
  // pages (evicting unlocked device prefixes), issues the host -> device copies and inserts the
  // extended path. Returns the promoted tokens (0: no host hit or no room). The caller re-matches
  // and moves its lock; wait_promotions() before the pages are read.
  int32_t promote(std::span<const int32_t> tokens, int32_t device_tokens, int32_t max_tokens);
  void wait_promotions();

  // A device match of matched_tokens (whole pages) was taken (write_through_selective counts
  // hits and backs a prefix up on its second).
  void on_match(std::span<const int32_t> tokens, int32_t matched_tokens);
  // tokens (whole pages, a path from the root) were inserted into the device tree.
  void on_insert(std::span<const int32_t> tokens);

  // Frees num_pages device pages: first the pages pending free, then by evicting device prefixes
  // (demoting them per the policy); returns with every such page free (copies reading them
  // waited for). Returns the pages freed that way (fewer when the tree runs out of unlocked ones).
  int32_t evict_device(int32_t num_pages);
  // Device pages whose last reference is a copy in flight: free once it lands. O(pages in flight).
  int32_t pages_pending_free() const;
  // write_back only (other policies copy nothing at eviction): evicts device prefixes until the
  // free pages plus those pending free reach target_pages, without waiting for the copies.
  void evict_ahead(int32_t target_pages);

  // Retires completed copies (unlocks their host nodes, drops their device references).
  void poll();
  void wait_all();
  // Drops the host tier (after waiting for copies); false while a host prefix is locked.
  bool reset();

  // Device pages held by copies in flight (one reference each), for the owner's refcount checks.
  void for_each_held_device_page(const std::function<void(PageId)>& fn) const;
  // CHECKs the host pool's invariants, that in-flight copies hold locked host nodes and
  // referenced device pages. O(host pages).
  void check_invariants() const;
  HiCacheStats stats() const;

 private:
  struct InFlight {
    uint64_t ticket = 0;
    RadixNodeHandle host_node = nullptr;  // locked until the copy lands
    std::vector<PageId> device_pages;     // one reference each until the copy lands
  };
  void on_device_evict(const EvictedNode& node);
  // Backs up the path tokens whose device pages are device_pages[i] for tokens [i*ps, (i+1)*ps):
  // copies what the host lacks (as much as fits). Returns the host-held tokens of the path.
  int32_t backup(std::span<const int32_t> tokens, std::span<const PageId> device_pages);
  void backup_device_path(std::span<const int32_t> tokens);

  PagePool* device_pool_;
  RadixCache* device_cache_;
  HostPool* host_;
  HiCacheIo* io_;
  HiCacheWritePolicy policy_;
  int32_t page_size_;
  std::deque<InFlight> in_flight_;
  uint64_t last_promotion_ticket_ = 0;
  std::unordered_map<uint64_t, int32_t> hit_counts_;  // hash of a matched prefix -> device hits
  HiCacheStats stats_;
};

}  // namespace strata
