// CaptureCounters: where a hidden-state capture job's time goes (issue 25's throughput), counted
// by the threads that do the work and printed once at the job's end (HiddenStore::close):
//   per step    download  the captured rows, device -> host (the model's one copy per step)
//               scatter   the host rows into each request's CapturedStates (and its spill file),
//                         on the capture writer's thread (engine/capture_writer.h), spread over
//                         its crew of threads by request
//               queue_wait  the engine step waiting for a free block (the writer is behind)
//               fence_wait  the engine waiting for the writer to store a finished request's rows
//                         (only when nothing else is left to run)
//   per write   spill     coalesced aux rows streamed to record files (writer thread)
//   per record  write     the rest of a record (the rows kept in memory, ids, mask, header),
//                         summed over the commit's threads
//   per group   sync      a group's record files finished (write) and fdatasync'ed, 8 at a time
//               index     the index lines and their fdatasync
// Process-wide: one capture job runs per process. Relaxed atomics: totals, not an ordering.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>

namespace strata {

struct CaptureCounter {
  std::atomic<int64_t> count{0};      // events (steps, records, groups)
  std::atomic<int64_t> nanos{0};      // wall time spent in them
  std::atomic<int64_t> bytes{0};      // bytes they moved
  std::atomic<int64_t> max_nanos{0};  // the longest one (one long stall vs many short ones)

  void add(int64_t ns, int64_t nbytes, int64_t n = 1) {
    count.fetch_add(n, std::memory_order_relaxed);
    nanos.fetch_add(ns, std::memory_order_relaxed);
    bytes.fetch_add(nbytes, std::memory_order_relaxed);
    int64_t m = max_nanos.load(std::memory_order_relaxed);
    while (ns > m && !max_nanos.compare_exchange_weak(m, ns, std::memory_order_relaxed)) {
    }
  }
  double seconds() const { return double(nanos.load(std::memory_order_relaxed)) * 1e-9; }
  double max_seconds() const { return double(max_nanos.load(std::memory_order_relaxed)) * 1e-9; }
};

struct CaptureCounters {
  CaptureCounter download, scatter;       // per engine step
  CaptureCounter queue_wait, fence_wait;  // the engine thread blocked on the capture writer
  CaptureCounter spill;                   // rows streamed to record files during generation
  CaptureCounter write, sync, index;      // per record (sync and index: per group)
  std::atomic<int64_t> spill_errors{0};   // failed spill writes (the record then fails)

  // One line: each phase's count, seconds (and the longest one's), GB and GB/s.
  std::string summary() const;
};

// The process's counters.
CaptureCounters& capture_counters();

// Measures a scope into a counter.
class CaptureTimer {
 public:
  CaptureTimer(CaptureCounter& c, int64_t bytes) : c_(c), bytes_(bytes) {}
  ~CaptureTimer() {
    c_.add(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                                begin_)
               .count(),
           bytes_);
  }
  CaptureTimer(const CaptureTimer&) = delete;
  CaptureTimer& operator=(const CaptureTimer&) = delete;

 private:
  CaptureCounter& c_;
  int64_t bytes_;
  std::chrono::steady_clock::time_point begin_ = std::chrono::steady_clock::now();
};

}  // namespace strata
