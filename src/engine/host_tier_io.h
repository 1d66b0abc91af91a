// What the engine's host KV tier copies through, and what it reports per rank. On one rank the
// HiCache's copier is a KvHostIoCopier over the backend's KvHostIo; under tensor parallelism it
// is the distributed runtime's (engine/parallel_runtime.h: GroupHostTier), which repeats every
// copy on every rank and gathers their HostTierRankStats.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/kv_host_io.h"
#include "kv/hicache.h"

namespace strata {

// The host tier's copies through a backend's copier (kv/ knows no backend). Does not own `io`.
class KvHostIoCopier : public HiCacheIo {
 public:
  explicit KvHostIoCopier(KvHostIo* io) : io_(io) {}
  uint64_t device_to_host(std::span<const PageCopy> c) override {
    return io_->device_to_host(convert(c));
  }
  uint64_t host_to_device(std::span<const PageCopy> c) override {
    return io_->host_to_device(convert(c));
  }
  bool done(uint64_t ticket) override { return io_->done(ticket); }
  void wait(uint64_t ticket) override { io_->wait(ticket); }
  int64_t page_bytes() const override { return io_->page_bytes(); }
  double copy_seconds() const override { return io_->copy_seconds(); }

 private:
  const std::vector<KvPageCopy>& convert(std::span<const PageCopy> c);
  KvHostIo* io_;
  std::vector<KvPageCopy> buf_;
};

// One rank's host-tier copies, for /metrics.
struct HostTierRankStats {
  int32_t rank = 0;
  int64_t host_bytes = 0;       // this rank's host memory for the tier
  int64_t pages_to_host = 0;    // pages copied device -> host
  int64_t pages_to_device = 0;  // pages promoted host -> device (host hits)
  int64_t bytes_to_host = 0;
  int64_t bytes_to_device = 0;
  double copy_seconds = 0;  // of this rank's completed copies
};

}  // namespace strata
