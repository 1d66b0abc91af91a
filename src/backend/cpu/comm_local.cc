#include "backend/cpu/comm_local.h"

#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

#include "core/check.h"

namespace strata {
namespace {

// What every rank posted for the collective in progress.
struct Posted {
  const Tensor* tensor = nullptr;         // all_reduce / all_gather input
  std::vector<uint8_t>* bytes = nullptr;  // broadcast
  int group_size = 0;                     // split
};

class LocalGroup {
 public:
  explicit LocalGroup(int size) : size_(size), posted_(size_t(size)) {}
  int size() const { return size_; }

  // Posts rank's input and waits until every rank has posted. False when the group is aborted.
  bool arrive(int rank, Posted p) {
    std::unique_lock<std::mutex> lk(mu_);
    posted_[size_t(rank)] = p;
    return rendezvous(lk);
  }
  // Waits until every rank is done reading the posted inputs. False when aborted.
  bool leave() {
    std::unique_lock<std::mutex> lk(mu_);
    return rendezvous(lk);
  }
  const Posted& posted(int rank) const { return posted_[size_t(rank)]; }

  void abort(const Status& reason) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (status_.ok()) status_ = reason.ok() ? internal_error("aborted") : reason;
    }
    cv_.notify_all();
  }
  Status status() const {
    std::lock_guard<std::mutex> lk(mu_);
    return status_;
  }

  // The groups a split() makes, by (split number, group index), between the split's rendezvous.
  void put_child(std::pair<int, int> key, std::shared_ptr<LocalGroup> child) {
    std::lock_guard<std::mutex> lk(mu_);
    children_[key] = std::move(child);
  }
  std::shared_ptr<LocalGroup> take_child(std::pair<int, int> key) {
    std::lock_guard<std::mutex> lk(mu_);
    return children_.at(key);
  }
  void erase_child(std::pair<int, int> key) {
    std::lock_guard<std::mutex> lk(mu_);
    children_.erase(key);
  }

 private:
  // A generation-counted barrier that an abort releases.
  bool rendezvous(std::unique_lock<std::mutex>& lk) {
    if (!status_.ok()) return false;
    const uint64_t gen = generation_;
    if (++arrived_ == size_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return true;
    }
    cv_.wait(lk, [&] { return generation_ != gen || !status_.ok(); });
    return generation_ != gen;
  }

  const int size_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  Status status_;
  std::vector<Posted> posted_;  // [size], valid between arrive() and leave()
  std::map<std::pair<int, int>, std::shared_ptr<LocalGroup>> children_;
};

float load(const Tensor& t, int64_t i) {
  return t.dtype == DType::kF32 ? t.ptr<float>()[i] : bf16_to_f32(t.ptr<uint16_t>()[i]);
}

class LocalComm : public Communicator {
 public:
  LocalComm(std::shared_ptr<LocalGroup> group, int rank) : group_(std::move(group)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }

  void all_reduce_sum(const Tensor& x) override {
    CHECK_MSG(x.device == Device::kCpu && x.is_contiguous(), "local all_reduce: host tensors only");
    CHECK_MSG(x.dtype == DType::kF32 || x.dtype == DType::kBF16, "all_reduce: {} not supported",
              dtype_name(x.dtype));
    if (!group_->arrive(rank_, Posted{.tensor = &x})) return;
    const int64_t n = x.numel();
    for (int r = 0; r < size(); ++r) {
      const Tensor& o = *group_->posted(r).tensor;
      if (o.numel() != n || o.dtype != x.dtype) {
        group_->abort(internal_error("all_reduce_sum: rank {} has {} {} values, rank {} {} {}", r,
                                     o.numel(), dtype_name(o.dtype), rank_, n,
                                     dtype_name(x.dtype)));
        return;
      }
    }
    // Rank order, float32: every rank computes the same bits whoever arrived first.
    sum_.assign(size_t(n), 0.0f);
    for (int r = 0; r < size(); ++r) {
      const Tensor& o = *group_->posted(r).tensor;
      for (int64_t i = 0; i < n; ++i) sum_[size_t(i)] += load(o, i);
    }
    if (!group_->leave()) return;  // nobody writes before every rank has read
    if (x.dtype == DType::kF32) {
      std::memcpy(x.data, sum_.data(), size_t(n) * sizeof(float));
    } else {
      from_f32(DType::kBF16, sum_.data(), x.data, n);
    }
  }

  void all_gather(const Tensor& in, const Tensor& out) override {
    CHECK_MSG(in.device == Device::kCpu && in.is_contiguous() && out.is_contiguous(),
              "local all_gather: contiguous host tensors only");
    CHECK_EQ(out.nbytes(), in.nbytes() * size());
    CHECK_EQ(int(out.dtype), int(in.dtype));
    if (!group_->arrive(rank_, Posted{.tensor = &in})) return;
    for (int r = 0; r < size(); ++r) {
      const Tensor& o = *group_->posted(r).tensor;
      if (o.nbytes() != in.nbytes()) {
        group_->abort(internal_error("all_gather: rank {} sends {} bytes, rank {} {}", r,
                                     o.nbytes(), rank_, in.nbytes()));
        return;
      }
      std::memcpy(static_cast<uint8_t*>(out.data) + r * in.nbytes(), o.data, size_t(in.nbytes()));
    }
    group_->leave();
  }

  void all_to_all(const Tensor& in, const Tensor& out) override {
    CHECK_MSG(in.device == Device::kCpu && in.is_contiguous() && out.is_contiguous(),
              "local all_to_all: contiguous host tensors only");
    CHECK_EQ(out.nbytes(), in.nbytes());
    CHECK_EQ(int(out.dtype), int(in.dtype));
    CHECK_EQ(in.nbytes() % size(), 0);
    if (!group_->arrive(rank_, Posted{.tensor = &in})) return;
    const int64_t chunk = in.nbytes() / size();
    for (int r = 0; r < size(); ++r) {
      const Tensor& o = *group_->posted(r).tensor;
      if (o.nbytes() != in.nbytes()) {
        group_->abort(internal_error("all_to_all: rank {} sends {} bytes, rank {} {}", r,
                                     o.nbytes(), rank_, in.nbytes()));
        return;
      }
    }
    // Nobody writes `out` before every rank has read its chunks: `out` may be another rank's
    // `in` only in tests that alias them, which this keeps correct.
    std::vector<uint8_t> mine(size_t(in.nbytes()));
    for (int r = 0; r < size(); ++r)
      std::memcpy(mine.data() + r * chunk,
                  static_cast<const uint8_t*>(group_->posted(r).tensor->data) + rank_ * chunk,
                  size_t(chunk));
    if (!group_->leave()) return;
    std::memcpy(out.data, mine.data(), mine.size());
  }

  StatusOr<std::unique_ptr<Communicator>> split(int group_size) override {
    if (group_size < 1 || size() % group_size != 0)
      return invalid_argument("split: groups of {} ranks do not divide {}", group_size, size());
    const std::pair<int, int> key{splits_++, rank_ / group_size};
    if (!group_->arrive(rank_, Posted{.group_size = group_size})) return group_->status();
    for (int r = 0; r < size(); ++r)
      if (group_->posted(r).group_size != group_size) {
        const Status s = internal_error("split: rank {} asks for groups of {}, rank {} {}", r,
                                        group_->posted(r).group_size, rank_, group_size);
        group_->abort(s);
        return s;
      }
    const bool first = rank_ % group_size == 0;  // makes its group's state
    if (first) group_->put_child(key, std::make_shared<LocalGroup>(group_size));
    if (!group_->leave()) return group_->status();
    std::shared_ptr<LocalGroup> child = group_->take_child(key);
    if (!group_->leave()) return group_->status();
    if (first) group_->erase_child(key);
    return std::unique_ptr<Communicator>(
        std::make_unique<LocalComm>(std::move(child), rank_ % group_size));
  }

  Status broadcast_bytes(std::vector<uint8_t>& bytes, int root) override {
    CHECK_MSG(root >= 0 && root < size(), "broadcast root {} of {}", root, size());
    if (!group_->arrive(rank_, Posted{.bytes = &bytes})) return group_->status();
    if (rank_ != root) *group_->posted(rank_).bytes = *group_->posted(root).bytes;
    if (!group_->leave()) return group_->status();
    return Status();
  }

  Status barrier() override {
    if (!group_->arrive(rank_, Posted{})) return group_->status();
    return Status();
  }

  void abort(const Status& reason) override { group_->abort(reason); }
  Status status() const override { return group_->status(); }

 private:
  std::shared_ptr<LocalGroup> group_;
  const int rank_;
  std::vector<float> sum_;  // all_reduce scratch
  int splits_ = 0;          // split() calls so far (the same on every rank)
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_local_comm_group(int size) {
  CHECK_GE(size, 1);
  auto group = std::make_shared<LocalGroup>(size);
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < size; ++r) comms.push_back(std::make_unique<LocalComm>(group, r));
  return comms;
}

}  // namespace strata
