// The writer side of hidden-state capture (issue 25) on the CPU, at the data rate of the 8B shape
// on an H200, without a GPU: a simulated engine hands the real CaptureWriter one block of
// captured rows per step (engine_loop.cc's store_captured), the rows go into each record's real
// CapturedStates streamed to its RecordFile (HiddenStore::begin_record), each record's last
// position comes from a one-token tail request as pipeline/engine_capture.cc does it, and a job
// thread commits finished records in groups (HiddenStore::commit, as the job's runner does).
//
// The engine's forward is a sleep of the time the GPU would take: max(decode rows / --rate,
// --min-step-ms) + prefill rows / --prefill-rate, so the bench measures what capture adds on the
// host: the engine thread's time blocked on the writer (queue_wait: no free block), the end of
// the run waiting on the writer and the commits, peak memory and the disk write rate. The
// ratio printed is (sum of the forwards) / (wall until the last commit): the throughput with
// capture relative to the same steps without it, the host's share of issue 25's acceptance
// (>= 0.85 on the device, where the download and the GPU's own variance add to it).
//
// Tail modes (--tail):
//   direct  the record's own states with CapturedStates::keep_written (engine_capture.cc now)
//   copy    a separate CapturedStates per tail, grown to the record's whole length, then copied
//           row by row into the record (engine_capture.cc before it: kept to show the cost)
// --download-copy 1 adds the host copy of each step's rows (CudaBackend::download's memcpy from
// its pinned staging, on the host thread pool) to the engine thread, as on the device.
//
// Usage: strata_bench_capture_writer_bench --dir DIR [--records 1000] [--concurrency 885]
//          [--prompt 48] [--gen 1024] [--hidden 4096] [--aux 3] [--rate 20000]
//          [--prefill-rate 200000] [--min-step-ms 8] [--chunk 8192] [--page 16] [--depth 3]
//          [--tail direct|copy] [--download-copy 0|1] [--keep 0|1]
// The defaults are the device's run (capture_run.sh: 1,000 x 1,024 tokens, ~33.5 GB); on a small
// machine scale --records, --concurrency and --gen down (the data rate stays the device's).
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/capture_counters.h"
#include "core/check.h"
#include "core/thread_pool.h"
#include "engine/capture_writer.h"
#include "engine/captured_states.h"
#include "pipeline/hidden_store.h"

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

struct Args {
  std::string dir;
  int64_t records = 1000, concurrency = 885, prompt = 48, gen = 1024, hidden = 4096, aux = 3;
  double rate = 20000, prefill_rate = 200000, min_step_ms = 8;
  int64_t chunk = 8192, page = 16, depth = 3;
  std::string tail = "direct";
  bool download_copy = true, keep = false;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--dir")
      a.dir = v;
    else if (k == "--records")
      a.records = std::atoll(v.c_str());
    else if (k == "--concurrency")
      a.concurrency = std::atoll(v.c_str());
    else if (k == "--prompt")
      a.prompt = std::atoll(v.c_str());
    else if (k == "--gen")
      a.gen = std::atoll(v.c_str());
    else if (k == "--hidden")
      a.hidden = std::atoll(v.c_str());
    else if (k == "--aux")
      a.aux = std::atoll(v.c_str());
    else if (k == "--rate")
      a.rate = std::atof(v.c_str());
    else if (k == "--prefill-rate")
      a.prefill_rate = std::atof(v.c_str());
    else if (k == "--min-step-ms")
      a.min_step_ms = std::atof(v.c_str());
    else if (k == "--chunk")
      a.chunk = std::atoll(v.c_str());
    else if (k == "--page")
      a.page = std::atoll(v.c_str());
    else if (k == "--depth")
      a.depth = std::atoll(v.c_str());
    else if (k == "--tail")
      a.tail = v;
    else if (k == "--download-copy")
      a.download_copy = v != "0";
    else if (k == "--keep")
      a.keep = v != "0";
    else {
      std::fprintf(stderr, "unknown flag %s (see the top of bench/capture_writer_bench.cc)\n",
                   k.c_str());
      std::exit(2);
    }
  }
  if (a.dir.empty() || (a.tail != "direct" && a.tail != "copy") || a.records <= 0 ||
      a.concurrency <= 0 || a.prompt <= 0 || a.gen <= 0 || a.rate <= 0) {
    std::fprintf(stderr, "usage: see the top of bench/capture_writer_bench.cc (--dir is needed)\n");
    std::exit(2);
  }
  return a;
}

int64_t peak_rss_bytes() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::atoll(line.c_str() + 6) * 1024;
  return -1;
}

// One record through the simulated engine.
struct Rec {
  int64_t index = 0;
  std::shared_ptr<CapturedStates> states, tail;  // tail: --tail copy's separate states
  int64_t next = 0;                              // the next position its request captures
  int64_t n = 0;                                 // prompt + generated tokens
  enum Phase { kRunning, kFinishing, kTail, kTailFinishing } phase = kRunning;
  uint64_t fence = 0;  // the last writer job holding its rows
  std::shared_ptr<CapturedRecord> record;
};

// The job's thread: commits finished records in groups, like the runner's commit_hidden_group.
class Committer {
 public:
  Committer(HiddenStore& store, int aux, int64_t hidden)
      : store_(store), aux_(aux), hidden_(hidden), thread_([this] { run(); }) {}
  ~Committer() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void add(std::string id, std::shared_ptr<CapturedRecord> r) {
    std::lock_guard<std::mutex> lk(mu_);
    inbox_.emplace_back(std::move(id), std::move(r));
    cv_.notify_all();
  }
  int64_t committed() const {
    std::lock_guard<std::mutex> lk(mu_);
    return committed_;
  }
  int64_t groups() const {
    std::lock_guard<std::mutex> lk(mu_);
    return groups_;
  }
  double max_group_s() const {
    std::lock_guard<std::mutex> lk(mu_);
    return max_group_s_;
  }

 private:
  void run() {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      cv_.wait(lk, [&] { return stop_ || !inbox_.empty(); });
      if (inbox_.empty()) return;
      std::vector<std::pair<std::string, std::shared_ptr<CapturedRecord>>> batch(
          std::make_move_iterator(inbox_.begin()), std::make_move_iterator(inbox_.end()));
      inbox_.clear();
      lk.unlock();
      std::vector<HiddenStore::Pending> pending;
      for (const auto& [id, r] : batch) pending.push_back({"bench", id, r.get()});
      const Clock::time_point t = Clock::now();
      const Status st = store_.commit(pending, aux_, hidden_);
      CHECK_MSG(st.ok(), "commit: {}", st.to_string());
      const double s = since(t);
      batch.clear();  // the records' memory goes now, as the runner's outcomes do
      lk.lock();
      committed_ += int64_t(pending.size());
      ++groups_;
      max_group_s_ = std::max(max_group_s_, s);
    }
  }

  HiddenStore& store_;
  const int aux_;
  const int64_t hidden_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<std::string, std::shared_ptr<CapturedRecord>>> inbox_;
  int64_t committed_ = 0, groups_ = 0;
  double max_group_s_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

int run(const Args& a) {
  namespace fs = std::filesystem;
  fs::remove_all(a.dir);
  const int64_t width = (a.aux + 1) * a.hidden, row_bytes = width * 2;
  const int64_t n = a.prompt + a.gen;
  std::printf(
      "capture writer bench: %lld records x (%lld prompt + %lld generated) tokens, %lld running, "
      "%lld aux + final norm x %lld bf16 = %lld B per row, %.0f tok/s decode (%.0f MB/s of rows), "
      "tail %s, download copy %s, writer depth %lld, %d host threads\n",
      (long long)a.records, (long long)a.prompt, (long long)a.gen, (long long)a.concurrency,
      (long long)a.aux, (long long)a.hidden, (long long)row_bytes, a.rate,
      a.rate * double(row_bytes) / 1e6, a.tail.c_str(), a.download_copy ? "on" : "off",
      (long long)a.depth, num_threads());
  std::vector<int> layers;
  for (int64_t i = 0; i < a.aux; ++i) layers.push_back(int(i + 1));
  nlohmann::json meta = {{"model", "capture_writer_bench"},
                         {"capture", {{"layers", layers}, {"hidden_size", a.hidden}}}};
  auto store =
      HiddenStore::open(a.dir, meta, [](const std::string&, const std::string&) { return false; });
  CHECK_MSG(store.ok(), "{}", store.status().to_string());
  // The "device's" rows: random bytes, one block of the largest step.
  const int64_t max_rows = std::max(a.concurrency + a.chunk, a.concurrency * (a.page + 1));
  std::vector<uint8_t> device(size_t(max_rows * row_bytes));
  std::mt19937_64 rng(1);
  for (size_t i = 0; i + 8 <= device.size(); i += 8) {
    const uint64_t v = rng();
    std::memcpy(device.data() + i, &v, 8);
  }

  const Clock::time_point start = Clock::now();
  double forward_s = 0, queue_wait_s = 0, max_queue_wait_s = 0, copy_s = 0;
  int64_t steps = 0, rows_total = 0;
  {
    CaptureWriter writer(int(a.depth));
    Committer committer(**store, int(a.aux), a.hidden);
    std::vector<std::unique_ptr<Rec>> running;
    int64_t admitted = 0;
    while (admitted < a.records || !running.empty()) {
      // The step: tails first (urgent), then prefill chunks of new or partly prefilled records,
      // then one decode row per decoding record. (record, first position, rows)
      struct Seg {
        Rec* rec;
        int64_t first, count;
      };
      std::vector<Seg> segs;
      int64_t decode_rows = 0, prefill_rows = 0;
      while (admitted < a.records && int64_t(running.size()) < a.concurrency) {
        auto r = std::make_unique<Rec>();
        r->index = admitted++;
        r->n = n;
        r->states = (*store)->begin_record("bench", std::to_string(r->index), int(a.aux), a.hidden,
                                           DType::kBF16, n + 1);
        running.push_back(std::move(r));
      }
      for (auto& r : running) {
        if (r->phase == Rec::kFinishing && writer.written(r->fence)) {
          // The finished event: the tail request over prompt + response is submitted.
          if (a.tail == "direct") {
            r->states->keep_written();
            r->tail = r->states;
          } else {
            r->tail = std::make_shared<CapturedStates>(DType::kBF16);
          }
          r->phase = Rec::kTail;
          const int64_t first = (r->n - 1) / a.page * a.page;  // the last page is recomputed
          segs.push_back({r.get(), first, r->n - first});
          prefill_rows += r->n - first;
        }
      }
      int64_t budget = a.chunk;
      for (auto& r : running) {
        if (r->phase != Rec::kRunning) continue;
        if (r->next < a.prompt) {
          if (budget <= 0) continue;
          const int64_t k = std::min(budget, a.prompt - r->next);
          segs.push_back({r.get(), r->next, k});
          r->next += k;
          budget -= k;
          prefill_rows += k;
        } else if (r->next < r->n - 1) {
          segs.push_back({r.get(), r->next, 1});
          ++r->next;
          ++decode_rows;
        }
      }
      if (segs.empty()) {  // every running request waits for its rows: as the engine, block
        uint64_t fence = UINT64_MAX;
        for (auto& r : running) fence = std::min(fence, r->fence);
        writer.wait(fence);
      }
      // The forward.
      const double fwd =
          (decode_rows > 0 ? std::max(double(decode_rows) / a.rate, a.min_step_ms * 1e-3) : 0.0) +
          double(prefill_rows) / a.prefill_rate;
      const Clock::time_point step_start = Clock::now();
      forward_s += fwd;
      std::this_thread::sleep_until(step_start + std::chrono::duration<double>(fwd));
      // Hands the block over (store_captured): a free buffer, the rows, the segments.
      int64_t rows = 0;
      for (const Seg& s : segs) rows += s.count;
      if (rows > 0) {
        CaptureJob job;
        Clock::time_point t = Clock::now();
        job.rows = writer.take_buffer();
        const double w = since(t);
        queue_wait_s += w;
        max_queue_wait_s = std::max(max_queue_wait_s, w);
        t = Clock::now();
        job.rows.resize(size_t(rows * row_bytes));
        if (a.download_copy) {
          uint8_t* dst = job.rows.data();
          parallel_for(rows * row_bytes, int64_t(1) << 20, [&](int64_t b, int64_t e) {
            std::memcpy(dst + b, device.data() + b, size_t(e - b));
          });
        }
        copy_s += since(t);
        job.width = width;
        job.dtype = DType::kBF16;
        int64_t row = 0;
        for (const Seg& s : segs) {
          job.states.push_back(s.rec->phase == Rec::kTail ? s.rec->tail : s.rec->states);
          job.row_begin.push_back(int32_t(row));
          job.row_count.push_back(int32_t(s.count));
          for (int64_t p = s.first; p < s.first + s.count; ++p) job.positions.push_back(p);
          row += s.count;
        }
        const uint64_t seq = writer.submit(std::move(job));
        for (const Seg& s : segs) s.rec->fence = seq;
        rows_total += rows;
      }
      steps += rows > 0;
      // Requests that ended this step wait for their fence (engine_loop.cc's retire).
      for (auto& r : running) {
        if (r->phase == Rec::kRunning && r->next == r->n - 1)
          r->phase = Rec::kFinishing;
        else if (r->phase == Rec::kTail)
          r->phase = Rec::kTailFinishing;
      }
      // Tails whose rows are stored: the record is finished (finish_record) and committed.
      for (auto& r : running) {
        if (r->phase != Rec::kTailFinishing) continue;
        if (running.size() > 1 && !writer.written(r->fence)) continue;
        writer.wait(r->fence);
        if (r->tail != r->states)
          for (int64_t p = 0; p < r->n; ++p)
            if (!r->states->has(p) && r->tail->has(p)) r->states->put_row(p, *r->tail);
        r->tail.reset();
        auto rec = std::make_shared<CapturedRecord>();
        rec->input_ids.assign(size_t(r->n), 7);
        rec->loss_mask.assign(size_t(r->n), 1);
        r->states->truncate(r->n);
        CHECK_MSG(r->states->complete(r->n), "record {} misses positions", r->index);
        rec->states = std::move(r->states);
        committer.add(std::to_string(r->index), std::move(rec));
        r.reset();
      }
      running.erase(std::remove(running.begin(), running.end(), nullptr), running.end());
    }
    const double engine_s = since(start);
    while (committer.committed() < a.records)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    const double end_s = since(start);
    int64_t bytes = 0;
    for (const auto& f : fs::directory_iterator(a.dir)) bytes += int64_t(f.file_size());
    std::printf(
        "steps %lld, rows %lld (%.2f GB); forwards (the GPU alone) %.2f s; engine loop %.2f s; "
        "last commit %.2f s (the end waited %.2f s on the writer and the commits)\n",
        (long long)steps, (long long)rows_total, double(rows_total * row_bytes) / 1e9, forward_s,
        engine_s, end_s, end_s - engine_s);
    std::printf(
        "engine thread: queue_wait %.2f s (longest %.3f s), host copy of the rows %.2f s; "
        "commits: %lld groups, longest %.2f s\n",
        queue_wait_s, max_queue_wait_s, copy_s, (long long)committer.groups(),
        committer.max_group_s());
    std::printf("written %.2f GB (%.0f B per token) at %.0f MB/s over the run; peak RSS %.2f GB\n",
                double(bytes) / 1e9, double(bytes) / double(a.records * n),
                double(bytes) / end_s / 1e6, double(peak_rss_bytes()) / 1e9);
    std::printf("ratio (forwards / wall until the last commit): %.3f\n", forward_s / end_s);
  }
  std::printf("counters: %s\n", capture_counters().summary().c_str());
  if (!a.keep) fs::remove_all(a.dir);
  return 0;
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) { return strata::run(strata::parse(argc, argv)); }
