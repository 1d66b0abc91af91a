#include "engine/capture_writer.h"

#include <algorithm>
#include <functional>
#include <unordered_map>

#include "core/capture_counters.h"

namespace strata {

// The threads that store one job together: run(fn) calls fn(k) for every k in [0, size()) at
// once, the caller taking k = 0, and returns when all have returned.
class CaptureWriter::Crew {
 public:
  explicit Crew(int size) {
    for (int k = 1; k < size; ++k) threads_.emplace_back([this, k] { loop(k); });
  }
  ~Crew() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : threads_) t.join();
  }
  int size() const { return int(threads_.size()) + 1; }
  void run(const std::function<void(int)>& fn) {
    if (threads_.empty()) return fn(0);
    {
      std::lock_guard<std::mutex> lk(mu_);
      fn_ = &fn;
      pending_ = int(threads_.size());
      ++generation_;
    }
    cv_.notify_all();
    fn(0);
    std::unique_lock<std::mutex> lk(mu_);
    done_cv_.wait(lk, [&] { return pending_ == 0; });
    fn_ = nullptr;
  }

 private:
  void loop(int k) {
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      cv_.wait(lk, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      const std::function<void(int)>* fn = fn_;
      lk.unlock();
      (*fn)(k);
      lk.lock();
      if (--pending_ == 0) done_cv_.notify_all();
    }
  }

  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(int)>* fn_ = nullptr;  // the current job's; guarded by mu_
  int pending_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

CaptureWriter::CaptureWriter(int depth, int threads)
    : depth_(depth < 2 ? 2 : depth), crew_(std::make_unique<Crew>(std::max(1, threads))) {
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

CaptureBlock CaptureWriter::take_buffer() {
  std::unique_lock<std::mutex> lk(mu_);
  if (out_ >= depth_) {
    CaptureTimer timer(capture_counters().queue_wait, 0);
    cv_.wait(lk, [&] { return out_ < depth_; });
  }
  ++out_;
  if (free_.empty()) return {};
  CaptureBlock b = std::move(free_.back());
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
    CaptureBlock rows = std::move(job.rows);
    job = CaptureJob();  // lets go of the states before the fence passes
    lk.lock();
    free_.push_back(std::move(rows));
    --out_;
    ++done_;
    cv_.notify_all();
  }
}

// Scatters the rows into each request's states (their spill streams the aux blocks to its file),
// spread over the crew by request: a decode step at batch 512 of an 8B model is 16 MB of rows and
// as many record-file rows, more than one thread keeps up with at the engine's pace. A request's
// segments (several for a tree's accepted path) all go to one thread, and jobs run one after
// another, so each request's states and spill see one writer at a time, in position order.
void CaptureWriter::store(const CaptureJob& job) {
  const int64_t row_bytes = job.width * dtype_size(job.dtype);
  // The job's requests, each with its segments and rows, in order of first appearance.
  struct Unit {
    CapturedStates* states;
    std::vector<size_t> segments;
    int64_t rows = 0;
  };
  std::vector<Unit> units;
  std::unordered_map<const CapturedStates*, size_t> unit_of;
  int64_t rows = 0;
  for (size_t s = 0; s < job.states.size(); ++s) {
    CapturedStates* states = job.states[s].get();
    if (states == nullptr || job.row_count[s] <= 0) continue;
    auto [it, added] = unit_of.try_emplace(states, units.size());
    if (added) units.push_back(Unit{states, {}, 0});
    units[it->second].segments.push_back(s);
    units[it->second].rows += job.row_count[s];
    rows += job.row_count[s];
  }
  CaptureTimer timer(capture_counters().scatter, rows * row_bytes);
  // Thread k takes the units whose rows start in [k, k + 1) * rows / size (contiguous, balanced
  // by rows).
  const int size =
      int(std::min<int64_t>(crew_->size(), std::max<int64_t>(1, int64_t(units.size()))));
  std::vector<size_t> first(size_t(size) + 1, units.size());
  first[0] = 0;
  int64_t seen = 0;
  for (size_t u = 0, k = 1; u < units.size(); ++u) {
    while (k < size_t(size) && seen >= int64_t(k) * rows / size) first[k++] = u;
    seen += units[u].rows;
  }
  crew_->run([&](int k) {
    if (k >= size) return;
    for (size_t u = first[size_t(k)]; u < first[size_t(k) + 1]; ++u) {
      const Unit& unit = units[u];
      for (size_t s : unit.segments) {
        const int32_t begin = job.row_begin[s];
        for (int32_t row = begin; row < begin + job.row_count[s]; ++row)
          unit.states->put(job.positions[size_t(row)], job.rows.data() + int64_t(row) * row_bytes,
                           job.dtype, job.width);
      }
    }
  });
}

}  // namespace strata
