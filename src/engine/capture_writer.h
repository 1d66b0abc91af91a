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
// Memory is bounded: at most `depth` blocks exist (the one the engine fills plus those queued or
// being written); when all are queued, take_buffer() blocks the engine until the writer frees one.
//
// A job's rows are stored by a crew of `threads` threads of the writer's own (the writer's thread
// and threads - 1 more), by request: each request's segments go to one of them, so its states
// and spill see one writer at a time, in position order. Not the host thread pool: the engine
// thread's own parallel loops (the download's copy) ran inline while a job held the pool, and a
// job waited for the pool while the engine held it.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/dtype.h"
#include "engine/capture_block.h"
#include "engine/captured_states.h"

namespace strata {

struct CaptureJob {
  CaptureBlock rows;  // [num rows, width] of dtype
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
  explicit CaptureWriter(int depth = 3, int threads = 4);
  ~CaptureWriter();  // processes what is queued, then joins
  CaptureWriter(const CaptureWriter&) = delete;
  CaptureWriter& operator=(const CaptureWriter&) = delete;

  // A free row block for the next job (its old contents are garbage; empty the first times);
  // blocks while `depth` jobs are queued or being written (the time is
  // CaptureCounters::queue_wait). Blocks keep their memory (and page lock) across jobs.
  CaptureBlock take_buffer();
  // Queues a job; returns its sequence number.
  uint64_t submit(CaptureJob job);
  // Every job up to `seq` is processed (seq 0: always).
  bool written(uint64_t seq) const;
  // Blocks until every job up to `seq` is processed (the time is CaptureCounters::fence_wait).
  void wait(uint64_t seq);
  uint64_t last_submitted() const;

 private:
  class Crew;  // capture_writer.cc
  void run();
  void store(const CaptureJob& job);

  const int depth_;
  std::unique_ptr<Crew> crew_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<CaptureJob> queue_;
  std::vector<CaptureBlock> free_;
  int out_ = 0;  // buffers handed out or queued, not yet back in free_
  uint64_t submitted_ = 0, done_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace strata
