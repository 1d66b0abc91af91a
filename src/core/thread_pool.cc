#include "core/thread_pool.h"

#include <algorithm>
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
    Job job;
    {
      std::lock_guard<std::mutex> lk(mu_);
      job = Job{&fn, n, chunks, ++generation_};
      job_ = job;
      next_ = 0;
      pending_ = chunks;
    }
    cv_.notify_all();
    work(job);
    std::unique_lock<std::mutex> lk(mu_);
    done_cv_.wait(lk, [this] { return pending_ == 0; });
  }

 private:
  struct Job {
    const std::function<void(int64_t, int64_t)>* fn = nullptr;
    int64_t n = 0, chunks = 0;
    uint64_t generation = 0;
  };

  // Chunks are claimed under the lock and only for the job the worker woke for. A worker woken
  // for one job can reach here after that job finished and the next one started (ThreadSanitizer
  // caught it reading the next job's fields): it must not claim the new job's chunks with the
  // old job's bounds, or a chunk runs twice and the job "ends" while a chunk still runs.
  void work(const Job& job) {
    for (;;) {
      int64_t c;
      {
        std::lock_guard<std::mutex> lk(mu_);
        if (generation_ != job.generation || next_ >= job.chunks) return;
        c = next_++;
      }
      (*job.fn)(job.n * c / job.chunks, job.n * (c + 1) / job.chunks);
      std::lock_guard<std::mutex> lk(mu_);
      if (--pending_ == 0) done_cv_.notify_all();
    }
  }
  void loop() {
    uint64_t seen = 0;
    for (;;) {
      Job job;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        job = job_;
      }
      work(job);
    }
  }

  std::vector<std::thread> workers_;
  std::mutex mu_, run_mu_;  // run_mu_: one job at a time (a nested parallel_for runs inline)
  std::condition_variable cv_, done_cv_;
  // Guarded by mu_. The generation only advances once pending_ reached 0, so every chunk that
  // decrements pending_ belongs to the current job.
  Job job_;
  int64_t next_ = 0, pending_ = 0;
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
