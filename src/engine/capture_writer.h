// CaptureWriter: stores the engine's captured hidden states on a thread of its own, so the engine
// step only hands each step's downloaded block over and goes on with the next forward (issue 25:
// scattering the rows into each request's CapturedStates and streaming their aux blocks to the
// record files took ~60 of a job's 80 s inside the step).
//
// A job is one step's block, [rows, width] of the capture dtype, plus which request (its
// CapturedStates) and position each stored row belongs to. Jobs are processed in submission order,
// one at a time, so positions of one request arrive in order across steps. Each job gets a sequence
// number (from 1); written(seq) says whether the writer has processed every job up to it, which is
// the fence a request's finished event waits for (engine_loop.cc): its states are read only after
// that.
//
// Memory is bounded: at most `max_blocks` blocks exist (the one the engine fills plus those queued
// or being written), and beyond two of them, the queued ones hold at most `max_bytes`; at either
// bound take_buffer() blocks the engine until the writer frees one. The bounds are deep on
// purpose: the writer's file writes stall now and then for far longer than a step (on the H200,
// 46 stalls cost a queue of 3 blocks 14 s of a 73 s job, while the writer was busy only 27 s):
// 1 GiB is ~32 decode steps of an 8B model at batch 1,000 (32 MB each), or 4 prefill chunks of
// 8,192 tokens. Freed blocks are kept for reuse (at most 8; the rest are let go).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/dtype.h"
#include "engine/captured_states.h"

namespace strata {

struct CaptureJob {
  std::vector<uint8_t> rows;  // [num rows, width] of dtype
  int64_t width = 0;
  DType dtype = DType::kBF16;
  // Segment s: rows [row_begin[s], row_begin[s] + row_count[s]) belong to states[s]. Rows of the
  // block in no segment are not stored (a request that does not capture, a rejected draft's row).
  std::vector<std::shared_ptr<CapturedStates>> states;
  std::vector<int32_t> row_begin, row_count;
  std::vector<int64_t> positions;  // per row of the block
};

class CaptureWriter {
 public:
  static constexpr int64_t kDefaultMaxBytes = int64_t(1) << 30;
  explicit CaptureWriter(int max_blocks = 64, int64_t max_bytes = kDefaultMaxBytes);
  ~CaptureWriter();  // processes what is queued, then joins
  CaptureWriter(const CaptureWriter&) = delete;
  CaptureWriter& operator=(const CaptureWriter&) = delete;

  // A free row buffer for the next job (its old contents are garbage); blocks while the bounds
  // above are reached (the time is CaptureCounters::queue_wait).
  std::vector<uint8_t> take_buffer();
  // Queues a job; returns its sequence number.
  uint64_t submit(CaptureJob job);
  // Every job up to `seq` is processed (seq 0: always).
  bool written(uint64_t seq) const;
  // Blocks until every job up to `seq` is processed (the time is CaptureCounters::fence_wait).
  void wait(uint64_t seq);
  uint64_t last_submitted() const;

 private:
  void run();
  static void store(const CaptureJob& job);

  bool full() const {  // mu_ held
    return out_ >= max_blocks_ || (out_ >= 2 && queued_bytes_ >= max_bytes_);
  }

  const int max_blocks_;
  const int64_t max_bytes_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<CaptureJob> queue_;
  std::vector<std::vector<uint8_t>> free_;
  int out_ = 0;               // buffers handed out or queued, not yet back in free_
  int64_t queued_bytes_ = 0;  // the rows of jobs queued or being written
  uint64_t submitted_ = 0, done_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace strata
