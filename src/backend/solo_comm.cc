#include "backend/solo_comm.h"

#include <atomic>
#include <mutex>

#include "core/check.h"

namespace strata {
namespace {

// Process-wide: the benchmarks read them without reaching into the engine's model.
struct Totals {
  std::atomic<int64_t> all_reduce_calls{0}, all_reduce_bytes{0};
  std::atomic<int64_t> all_gather_calls{0}, all_gather_bytes{0};
  std::atomic<int64_t> broadcast_calls{0}, broadcast_bytes{0};
  std::atomic<int64_t> barrier_calls{0};
};
Totals& totals() {
  static Totals t;
  return t;
}

class SoloComm : public Communicator {
 public:
  SoloComm(int size, Backend& backend) : size_(size), backend_(backend) { CHECK_GE(size, 1); }
  int rank() const override { return 0; }
  int size() const override { return size_; }

  // Each collective leaves its place in the backend's op stream (Backend::skipped_collective):
  // no merge of the ops around it, as around a real one.
  void all_reduce_sum(const Tensor& x) override {
    totals().all_reduce_calls.fetch_add(1, std::memory_order_relaxed);
    totals().all_reduce_bytes.fetch_add(x.nbytes(), std::memory_order_relaxed);
    backend_.skipped_collective(x.nbytes());
  }

  void all_gather(const Tensor& in, const Tensor& out) override {
    totals().all_gather_calls.fetch_add(1, std::memory_order_relaxed);
    totals().all_gather_bytes.fetch_add(in.nbytes(), std::memory_order_relaxed);
    backend_.skipped_collective(in.nbytes());
    CHECK_EQ(out.numel(), in.numel() * size_);
    CHECK(out.dtype == in.dtype);
    // Every slot gets this rank's part: the copy a real gather's receive would cost is small
    // next to the forward, and later ops see finite values of the right shape.
    const int64_t cols = in.dim(-1), rows = in.numel() / cols;
    const Tensor src = in.reshape({rows, cols});
    const Tensor dst = out.reshape({size_ * rows, cols});
    for (int r = 0; r < size_; ++r)
      backend_.copy_columns(src, 0, cols, dst.slice_rows(r * rows, (r + 1) * rows), 0);
  }

  Status broadcast_bytes(std::vector<uint8_t>& bytes, int root) override {
    CHECK_EQ(root, 0);  // only rank 0 exists; the driver's plans come from it
    totals().broadcast_calls.fetch_add(1, std::memory_order_relaxed);
    totals().broadcast_bytes.fetch_add(int64_t(bytes.size()), std::memory_order_relaxed);
    return status();
  }

  Status barrier() override {
    totals().barrier_calls.fetch_add(1, std::memory_order_relaxed);
    return status();
  }

  void abort(const Status& reason) override {
    std::lock_guard<std::mutex> lk(mu_);
    if (status_.ok()) status_ = reason.ok() ? internal_error("aborted") : reason;
  }
  Status status() const override {
    std::lock_guard<std::mutex> lk(mu_);
    return status_;
  }

 private:
  const int size_;
  Backend& backend_;
  mutable std::mutex mu_;
  Status status_;
};

}  // namespace

SkippedCollectives skipped_collectives() {
  const Totals& t = totals();
  return {.all_reduce_calls = t.all_reduce_calls.load(),
          .all_reduce_bytes = t.all_reduce_bytes.load(),
          .all_gather_calls = t.all_gather_calls.load(),
          .all_gather_bytes = t.all_gather_bytes.load(),
          .broadcast_calls = t.broadcast_calls.load(),
          .broadcast_bytes = t.broadcast_bytes.load(),
          .barrier_calls = t.barrier_calls.load()};
}

SkippedCollectives operator-(const SkippedCollectives& a, const SkippedCollectives& b) {
  return {.all_reduce_calls = a.all_reduce_calls - b.all_reduce_calls,
          .all_reduce_bytes = a.all_reduce_bytes - b.all_reduce_bytes,
          .all_gather_calls = a.all_gather_calls - b.all_gather_calls,
          .all_gather_bytes = a.all_gather_bytes - b.all_gather_bytes,
          .broadcast_calls = a.broadcast_calls - b.broadcast_calls,
          .broadcast_bytes = a.broadcast_bytes - b.broadcast_bytes,
          .barrier_calls = a.barrier_calls - b.barrier_calls};
}

std::unique_ptr<Communicator> make_solo_comm(int size, Backend& backend) {
  return std::make_unique<SoloComm>(size, backend);
}

}  // namespace strata
