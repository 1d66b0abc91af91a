#include "engine/capture_writer.h"

#include <chrono>

#include "core/capture_counters.h"

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

// Scatters the rows into each request's states (their spill streams the aux blocks to its file).
void CaptureWriter::store(const CaptureJob& job) {
  const int64_t row_bytes = job.width * dtype_size(job.dtype);
  CaptureTimer timer(capture_counters().scatter, int64_t(job.positions.size()) * row_bytes);
  for (size_t s = 0; s < job.states.size(); ++s) {
    CapturedStates* states = job.states[s].get();
    if (states == nullptr) continue;
    for (int32_t row = job.row_begin[s]; row < job.row_begin[s + 1]; ++row)
      states->put(job.positions[size_t(row)], job.rows.data() + int64_t(row) * row_bytes, job.dtype,
                  job.width);
  }
}

}  // namespace strata
