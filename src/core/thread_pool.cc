#include "core/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

namespace strata {
namespace {

class Pool {
 public:
  explicit Pool(int n) {
    for (int i = 0; i < n; ++i) workers_.emplace_back([this] { loop(); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  int size() const { return int(workers_.size()) + 1; }

  void run(int64_t n, int64_t min_chunk, const std::function<void(int64_t, int64_t)>& fn) {
    std::unique_lock<std::mutex> run_lock(run_mu_, std::try_to_lock);
    const int64_t max_chunks = std::max<int64_t>(1, n / std::max<int64_t>(1, min_chunk));
    const int64_t chunks = std::min<int64_t>(size(), max_chunks);
    if (!run_lock.owns_lock() || chunks <= 1) {  // nested or tiny: run inline
      fn(0, n);
      return;
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      fn_ = &fn;
      n_ = n;
      chunks_ = chunks;
      next_.store(0);
      pending_ = chunks;
      ++generation_;
    }
    cv_.notify_all();
    work();
    std::unique_lock<std::mutex> lk(mu_);
    done_cv_.wait(lk, [this] { return pending_ == 0; });
    fn_ = nullptr;
  }

 private:
  void work() {
    for (;;) {
      int64_t c = next_.fetch_add(1);
      if (c >= chunks_) return;
      const int64_t begin = n_ * c / chunks_, end = n_ * (c + 1) / chunks_;
      (*fn_)(begin, end);
      std::lock_guard<std::mutex> lk(mu_);
      if (--pending_ == 0) done_cv_.notify_all();
    }
  }
  void loop() {
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        if (fn_ == nullptr) continue;
      }
      work();
    }
  }

  std::vector<std::thread> workers_;
  std::mutex mu_, run_mu_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0, chunks_ = 0, pending_ = 0;
  std::atomic<int64_t> next_{0};
  uint64_t generation_ = 0;
  bool stop_ = false;
};

int configured_threads() {
  if (const char* s = std::getenv("STRATA_NUM_THREADS")) {
    int n = std::atoi(s);
    if (n > 0) return n;
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

Pool& pool() {
  static Pool p(configured_threads() - 1);
  return p;
}

}  // namespace

void parallel_for(int64_t n, int64_t min_chunk, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  pool().run(n, min_chunk, fn);
}

int num_threads() { return pool().size(); }

}  // namespace strata
