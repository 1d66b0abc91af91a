// The host KV tier under tensor parallelism (design.md §3, §4). Rank 0 alone decides: its radix
// tree, its host pool (kv/host_pool.h) and its HiCache policy are the only ones. Every copy rank 0
// issues between its KV pool and its host memory goes through TpHostTier (a HiCacheIo in front of
// rank 0's own copier), which records it; the record travels to every other rank with the next
// step's plan (dist/tp_driver.h), where TpHostMirror issues the same copy between that rank's
// own KV pool and its own host memory. So every rank demotes, keeps and promotes its own slice of
// the same pages. Page ids are rank 0's everywhere: every rank's pool has rank 0's page count and
// every rank's host mirror the same number of host pages (--hicache-size is per rank, as in
// SGLang; a page's bytes are the rank's own).
//
// Ordering. On each rank copies complete in submission order. A forward must not overwrite a
// device page a copy still reads, nor read a page a promotion still writes. Rank 0's HiCache
// waits (HiCacheIo::wait/done) exactly where its own forward needs it, so each message carries
// done_through: the newest ticket rank 0 saw complete before it. A worker issues the message's
// copies, then waits for its own copies up to that ticket, then runs the forward; copies rank 0
// has not waited for overlap the worker's forward as they overlap rank 0's.
//
// MLA: the latent row is replicated on every rank, so the ranks of one node copy the same bytes
// into host memory N times. Keeping it once per node would be correct in value (every rank's
// latent is bit-identical: the ranks' hidden states are equal after each all-reduce) but would
// make a promotion on rank r read host pages another rank's copy stream writes, which needs
// cross-rank (and, with launcher ranks, cross-process) synchronisation of the copies. Not done:
// each rank keeps its own copy (N x host memory for MLA; exact and simple).
//
// Thread-safety: TpHostTier is the engine thread's; TpHostMirror its worker rank's thread's.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "backend/kv_host_io.h"
#include "core/status.h"
#include "engine/host_tier_io.h"
#include "engine/parallel_runtime.h"
#include "kv/hicache.h"

namespace strata {

// One copy call of rank 0 (a batch of pages in one direction), as the workers repeat it.
struct HostCopyBatch {
  bool to_host = true;          // device -> host (demotion, backup); false: a promotion
  uint64_t ticket = 0;          // rank 0's ticket for it
  std::vector<PageCopy> pages;  // rank 0's device and host page ids
};

// What a worker must do with its host tier before its next forward.
struct HostTierSync {
  uint64_t done_through = 0;           // rank 0's newest completed ticket (0: none)
  std::vector<HostCopyBatch> batches;  // copies issued since the last message, in order

  // Little-endian wire form; decode() checks every length (a bad message is DataLoss).
  void encode(std::vector<uint8_t>& out) const;
  static StatusOr<HostTierSync> decode(std::span<const uint8_t> in);
};

// One rank's host-tier counters (engine/host_tier_io.h) as a worker's reply: little-endian;
// decode checks the length (a bad message is DataLoss).
void encode_rank_stats(const HostTierRankStats& stats, std::vector<uint8_t>& out);
StatusOr<HostTierRankStats> decode_rank_stats(std::span<const uint8_t> in);

// Rank 0's copier under tensor parallelism: issues each copy on rank 0's own copier (`local`)
// and records it for the workers. Made by attach_tp_host_tier (dist/tp_driver.h), which also
// installs `gather`: the per-rank statistics, a collective over the group.
class TpHostTier : public GroupHostTier {
 public:
  using Gather = std::function<StatusOr<std::vector<HostTierRankStats>>()>;
  TpHostTier(std::unique_ptr<HiCacheIo> local, int64_t host_pages);
  ~TpHostTier() override;

  uint64_t device_to_host(std::span<const PageCopy> copies) override;
  uint64_t host_to_device(std::span<const PageCopy> copies) override;
  bool done(uint64_t ticket) override;
  void wait(uint64_t ticket) override;
  int64_t page_bytes() const override { return local_->page_bytes(); }
  double copy_seconds() const override { return local_->copy_seconds(); }

  // What the workers have not been told yet (the driver sends it with the next message).
  HostTierSync take_sync();
  // Rank 0's own counters.
  HostTierRankStats local_stats() const;
  // Every rank's counters (rank 0 first). A collective: the engine thread, between steps. Sends
  // the copies not sent yet first, so the counts cover everything issued so far.
  StatusOr<std::vector<HostTierRankStats>> gather_rank_stats() override;
  // Whether copies were issued since the last gather_rank_stats().
  bool stats_stale() const override { return stale_; }

  // For attach_tp_host_tier: the gather collective, and what to call when this tier goes away.
  void set_group(Gather gather, std::function<void()> on_destroy);

 private:
  uint64_t record(bool to_host, uint64_t ticket, std::span<const PageCopy> copies);

  std::unique_ptr<HiCacheIo> local_;
  int64_t host_pages_;
  HostTierSync pending_;
  uint64_t done_through_ = 0;
  bool stale_ = false;
  int64_t pages_to_host_ = 0, pages_to_device_ = 0;
  Gather gather_;
  std::function<void()> on_destroy_;
};

// A worker rank's host tier: its own host memory mirroring rank 0's host pages for this rank's
// KV pool, driven by rank 0's HostTierSync messages.
class TpHostMirror {
 public:
  // Allocates num_host_pages pages of host memory for `kv` (which must outlive the mirror).
  static StatusOr<std::unique_ptr<TpHostMirror>> create(const Backend& backend, const KvStorage& kv,
                                                        int64_t num_host_pages, KvIoBackend io,
                                                        int rank);
  // Over any copier (create() uses the backend's; tests a scripted one).
  struct Geometry {
    int64_t device_pages = 0;  // of this rank's pool (rank 0's count)
    int64_t host_pages = 0;
  };
  TpHostMirror(std::unique_ptr<HiCacheIo> copier, Geometry geometry, int rank,
               std::unique_ptr<KvHostIo> owned = nullptr);
  // Issues the sync's copies, then waits for this rank's copies through sync.done_through.
  Status apply(const HostTierSync& sync);
  HostTierRankStats stats();

 private:
  std::unique_ptr<KvHostIo> owned_;  // the backend's copier under copier_, when create() made it
  std::unique_ptr<HiCacheIo> copier_;
  Geometry geometry_;
  int rank_;
  std::deque<std::pair<uint64_t, uint64_t>>
      tickets_;               // (rank 0's ticket, this rank's), not yet waited for
  uint64_t last_ticket_ = 0;  // this rank's newest
  uint64_t last_rank0_ticket_ = 0;
  int64_t pages_to_host_ = 0, pages_to_device_ = 0;
};

}  // namespace strata
