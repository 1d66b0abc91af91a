// The CUDA backend's launch recorder: runs each launch at once (eager mode), or records a step's
// launches and replays them as one CUDA graph (graph mode).
//
// A launch is an op id (ops.h), a trivially copyable parameter block and its launcher
// (launch.h). In graph mode a step's op ids and parameter bytes, in order, are its signature: an
// identical signature replays the graph captured for it, a new one is captured once (flush).
// This needs no help from the architecture code because the backend keeps a step's device
// addresses a function of its shapes (cuda_backend.h). Eager mode can also time every launch
// (profile): events around each launch, summed per op.
//
// Thread-safety: none (the backend's thread).
#pragma once

#include <cuda_runtime.h>

#include <cstring>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backend/cuda/launch.h"
#include "backend/cuda/ops.h"

namespace strata::cuda {

struct GraphStats {
  int64_t captures = 0;
  int64_t replays = 0;
  int64_t eager_steps = 0;
  // Graph mode: launches of the flushed steps, summed (launches merged at recording count once).
  int64_t launches = 0;
  // Graph mode: kernel nodes of the launched graphs, summed (an op that launches several kernels
  // counts each; what a fusion inside one op saves shows here, not in `launches`).
  int64_t kernels = 0;
  // Graph mode: host time from a step's first op to its graph launch (recording, signature,
  // lookup), summed over `recorded_steps`. The device idles through it.
  int64_t record_ns = 0;
  int64_t recorded_steps = 0;
  // Graph mode: segments launched before their step's end (flush_segment), summed.
  int64_t segments = 0;
  // The part of record_ns spent in flush (signature hash and lookup, graph launch or capture).
  int64_t flush_ns = 0;
  // The part of flush_ns spent capturing and instantiating graphs for new signatures.
  int64_t capture_ns = 0;
  // Eager steps: host time from the first op to the step's end (launching every op), and the
  // wait for the device after it. A wait near zero means the host, not the GPU, set the pace.
  int64_t eager_launch_ns = 0;
  int64_t eager_wait_ns = 0;
};

// Host clock for the step timings (steady, nanoseconds).
int64_t host_now_ns();

class GraphRecorder {
 public:
  GraphRecorder() = default;
  GraphRecorder(const GraphRecorder&) = delete;
  GraphRecorder& operator=(const GraphRecorder&) = delete;
  ~GraphRecorder();  // destroys the captured graphs

  bool graph_mode() const { return graph_mode_; }
  // The caller flushes first (a switch never splits a step).
  void set_graph_mode(bool on) { graph_mode_ = on; }

  // Runs (eager) or records (graph mode) one launch. `op` and the bytes of `p` join the step's
  // signature; `p` must be fully initialized, padding included (memset before filling).
  template <typename P>
  void record(Op op, const P& p, void (*fn)(const P&, const Launch&), const Launch& launch) {
    if (!graph_mode_) {
      if (profile_) {
        Profiled e{op, nullptr, nullptr};
        CUDA_CHECK(cudaEventCreate(&e.start));
        CUDA_CHECK(cudaEventCreate(&e.stop));
        CUDA_CHECK(cudaEventRecord(e.start, launch.stream));
        fn(p, launch);
        CUDA_CHECK(cudaEventRecord(e.stop, launch.stream));
        profiled_.push_back(e);
      } else {
        fn(p, launch);
      }
      return;
    }
    // A launch on the side stream (a side branch, CudaBackend::begin_side_branch) is replayed
    // there, and says so in the signature.
    const bool side = side_stream_ != nullptr && launch.stream == side_stream_;
    const int id = op | (side ? kSideLaneBit : 0);
    last_op_ = op;
    last_sig_start_ = signature_.size();
    signature_.append(reinterpret_cast<const char*>(&id), sizeof id);
    signature_.append(reinterpret_cast<const char*>(&p), sizeof p);
    // The parameter bytes already sit in the signature: a pending launch only names them (no
    // allocation per launch; the host's recording time is time the device waits).
    pending_.push_back(
        Pending{&run_recorded<P>, reinterpret_cast<AnyFn>(fn), last_sig_start_ + sizeof id, side});
  }
  // The stream of side branches: a launch recorded on it is captured on it (flush); fork and
  // join are launches of their own (events between the two streams).
  void set_side_stream(cudaStream_t s) { side_stream_ = s; }

  // Graph mode: when the last recorded launch of this step is `op`, copies its parameters into
  // `*p` and returns true (consecutive launches that can merge into one: the caller drops it and
  // records the merged launch).
  template <typename P>
  bool last(Op op, P* p) const {
    if (!graph_mode_ || pending_.empty() || last_op_ != op) return false;
    std::memcpy(static_cast<void*>(p), signature_.data() + last_sig_start_ + sizeof(int),
                sizeof *p);
    return true;
  }
  // Graph mode: removes the last recorded launch (to record a merged one instead).
  void drop_last() {
    pending_.pop_back();
    signature_.resize(last_sig_start_);
    last_op_ = kOpNone;
  }
  bool has_pending() const { return !pending_.empty(); }
  size_t pending_launches() const { return pending_.size(); }

  // Graph mode: replays or captures the recorded launches on `launch`; `step_start_ns` (the
  // step's first op) counts the step's host recording time. Eager or nothing recorded: nothing.
  void flush(const Launch& launch, int64_t step_start_ns);
  // Graph mode: replays or captures the launches recorded so far as a graph of their own and
  // lets the step go on (CudaTunables::graph_segment_launches): the device runs them while the
  // host records the rest. Nothing recorded: nothing.
  void flush_segment(const Launch& launch);
  // Destroys every captured graph (the next steps capture again).
  void drop_graphs();

  // Eager-mode profile: device time of every launch, summed per op, until the next
  // set_profile. collect_profile (after the device finished the launches) sums the events.
  void set_profile(bool on);
  void collect_profile();
  std::string profile_report(int steps) const;

  // Logs why each of the next captures happened (CudaTunables::explain_graph_captures).
  void set_explain_captures(bool on) { explain_captures_ = on; }

  GraphStats& stats() { return stats_; }
  const GraphStats& stats() const { return stats_; }

 private:
  using AnyFn = void (*)();
  // Runs a recorded launch from its parameter bytes (copied out: the signature's bytes carry no
  // alignment guarantee).
  template <typename P>
  static void run_recorded(const char* bytes, AnyFn fn, const Launch& launch) {
    P p;
    std::memcpy(static_cast<void*>(&p), bytes, sizeof p);
    reinterpret_cast<void (*)(const P&, const Launch&)>(fn)(p, launch);
  }
  struct Pending {
    void (*run)(const char*, AnyFn, const Launch&);
    AnyFn fn;
    size_t offset;  // of the parameter bytes in signature_
    bool side;      // replayed on side_stream_
  };
  static constexpr int kSideLaneBit = 1 << 16;  // in a signature's op id: a side-stream launch
  struct Graph {
    std::string signature;
    cudaGraphExec_t exec = nullptr;
    int64_t kernels = 0;  // kernel nodes in the graph
  };
  struct Profiled {
    int op;
    cudaEvent_t start, stop;
  };

  // Replays the graph captured for signature_ or captures one, launches it, and starts the next
  // signature.
  void launch_pending(const Launch& launch);
  // Logs the first difference between the new signature_ and the closest captured one.
  void explain_capture() const;

  bool graph_mode_ = false;
  bool explain_captures_ = false;
  cudaStream_t side_stream_ = nullptr;
  Op last_op_ = kOpNone;  // the last recorded launch (graph mode), for last()
  size_t last_sig_start_ = 0;
  std::string signature_;
  std::vector<Pending> pending_;
  std::unordered_map<size_t, Graph> graphs_;
  // Captured graphs kept at once (flush starts over): with segments (CudaTunables::
  // graph_segment_launches) a step shape takes several, e.g. 256 shapes of 8 segments, or ~110
  // shapes of a Kimi-K2.5 rank's ~18 at batch 1.
  static constexpr size_t kMaxGraphs = 2048;
  GraphStats stats_;

  bool profile_ = false;
  std::vector<Profiled> profiled_;
  std::unordered_map<int, std::pair<double, int64_t>> profile_ms_;  // op -> (ms, launches)
};

}  // namespace strata::cuda
