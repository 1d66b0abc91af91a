// A fake host-tier copier (kv/hicache.h's HiCacheIo) for the host KV tier's randomized tests:
// copies are queued and land in order, later — all up to a ticket on wait(), and at random when
// done() is asked — so a policy that reads a page before its copy landed, reuses a page a copy
// still reads or drops an in-flight page leaves the wrong values in the test's device pool.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <deque>
#include <random>
#include <span>
#include <vector>

#include "kv/hicache.h"

namespace strata::testing {

struct LateCopierShape {
  int32_t slots_per_page = 1;  // T values per page, in the device pool and the host pages alike
  int64_t page_bytes = 0;      // what page_bytes() reports (the tier's byte counters)
  uint32_t land_one_in = 2;    // done() lands the oldest queued copy while rng() % land_one_in == 0
};

// `device` is the test's device pool: [device pages * slots_per_page] values of T. The host
// pages are the copier's own, [host_pages * slots_per_page].
template <typename T>
class LateCopier : public HiCacheIo {
 public:
  LateCopier(std::vector<T>* device, int32_t host_pages, LateCopierShape shape, std::mt19937* rng)
      : device_(device),
        host_(size_t(host_pages) * size_t(shape.slots_per_page)),
        shape_(shape),
        rng_(rng) {}
  uint64_t device_to_host(std::span<const PageCopy> c) override { return push(c, true); }
  uint64_t host_to_device(std::span<const PageCopy> c) override { return push(c, false); }
  bool done(uint64_t t) override {
    while (!queue_.empty() && (*rng_)() % shape_.land_one_in == 0) land();
    return t <= completed_;
  }
  void wait(uint64_t t) override {
    EXPECT_LE(t, ticket_) << "waits for a copy never issued";
    while (completed_ < t && !queue_.empty()) land();
  }
  int64_t page_bytes() const override { return shape_.page_bytes; }
  double copy_seconds() const override { return 0; }

 private:
  struct Op {
    uint64_t ticket;
    bool to_host;
    std::vector<PageCopy> copies;
  };
  uint64_t push(std::span<const PageCopy> c, bool to_host) {
    queue_.push_back(Op{++ticket_, to_host, {c.begin(), c.end()}});
    return ticket_;
  }
  void land() {
    const Op& op = queue_.front();
    const size_t n = size_t(shape_.slots_per_page);
    for (const PageCopy& c : op.copies)
      for (size_t i = 0; i < n; ++i) {
        T& d = (*device_)[size_t(c.device_page) * n + i];
        T& h = host_[size_t(c.host_page) * n + i];
        if (op.to_host)
          h = d;
        else
          d = h;
      }
    completed_ = op.ticket;
    queue_.pop_front();
  }

  std::vector<T>* device_;
  std::vector<T> host_;
  LateCopierShape shape_;
  std::mt19937* rng_;
  std::deque<Op> queue_;
  uint64_t ticket_ = 0, completed_ = 0;
};

}  // namespace strata::testing
