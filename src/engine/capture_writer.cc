#include "engine/capture_writer.h"

#include <chrono>

#include "core/capture_counters.h"
#include "core/thread_pool.h"

namespace strata {

CaptureWriter::CaptureWriter(int depth) : depth_(depth < 2 ? 2 : depth) {
  thread_ = std::thread([this] { run(); });
}

CaptureWriter::~CaptureWriter() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::vector<uint8_t> CaptureWriter::take_buffer() {
  std::unique_lock<std::mutex> lk(mu_);
  if (out_ >= depth_) {
    CaptureTimer timer(capture_counters().queue_wait, 0);
    cv_.wait(lk, [&] { return out_ < depth_; });
  }
  ++out_;
  if (free_.empty()) return {};
  std::vector<uint8_t> b = std::move(free_.back());
  free_.pop_back();
  return b;
}

uint64_t CaptureWriter::submit(CaptureJob job) {
  uint64_t seq;
  {
    std::lock_guard<std::mutex> lk(mu_);
    queue_.push_back(std::move(job));
    seq = ++submitted_;
  }
  cv_.notify_all();
  return seq;
}

bool CaptureWriter::written(uint64_t seq) const {
  std::lock_guard<std::mutex> lk(mu_);
  return done_ >= seq;
}

uint64_t CaptureWriter::last_submitted() const {
  std::lock_guard<std::mutex> lk(mu_);
  return submitted_;
}

void CaptureWriter::wait(uint64_t seq) {
  std::unique_lock<std::mutex> lk(mu_);
  if (done_ >= seq) return;
  CaptureTimer timer(capture_counters().fence_wait, 0);
  cv_.wait(lk, [&] { return done_ >= seq; });
}

void CaptureWriter::run() {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_, and everything queued is written
    CaptureJob job = std::move(queue_.front());
    queue_.pop_front();
    lk.unlock();
    store(job);
    std::vector<uint8_t> rows = std::move(job.rows);
    job = CaptureJob();  // lets go of the states before the fence passes
    lk.lock();
    free_.push_back(std::move(rows));
    --out_;
    ++done_;
    cv_.notify_all();
  }
}

// Scatters the rows into each request's states (their spill streams the aux blocks to its file),
// spread over the host thread pool by request: a decode step at batch 512 of an 8B model is 16 MB
// of rows and as many record-file rows, more than one thread keeps up with at the engine's pace.
// A request's rows stay on one thread within a job, and jobs run one after another, so each
// request's states and spill see one writer at a time, in position order.
void CaptureWriter::store(const CaptureJob& job) {
  const int64_t row_bytes = job.width * dtype_size(job.dtype);
  int64_t rows = 0;
  for (int32_t n : job.row_count) rows += n;
  CaptureTimer timer(capture_counters().scatter, rows * row_bytes);
  parallel_for(int64_t(job.states.size()), 8, [&](int64_t begin, int64_t end) {
    for (int64_t s = begin; s < end; ++s) {
      CapturedStates* states = job.states[size_t(s)].get();
      if (states == nullptr) continue;
      const int32_t first = job.row_begin[size_t(s)];
      for (int32_t row = first; row < first + job.row_count[size_t(s)]; ++row)
        states->put(job.positions[size_t(row)], job.rows.data() + int64_t(row) * row_bytes,
                    job.dtype, job.width);
    }
  });
}

}  // namespace strata
