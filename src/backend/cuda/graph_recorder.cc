// GraphRecorder: the graph cache (signature hash, capture, replay) and the eager profile.
#include "backend/cuda/graph_recorder.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "core/log.h"

namespace strata::cuda {

int64_t host_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

namespace {

// The graph cache's key: 8 bytes per multiply (a step's signature is tens of KB at batch 1, and
// the host hashes it on the device's critical path); equality is still checked on the whole
// signature.
size_t signature_hash(const std::string& s) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ s.size();
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    h = (h ^ w) * 0xBF58476D1CE4E5B9ull;
    h ^= h >> 31;
  }
  for (; i < s.size(); ++i) h = (h ^ uint8_t(s[i])) * 0x94D049BB133111EBull;
  return size_t(h ^ (h >> 29));
}

// Once a capture (not a replay): the kernel nodes, for GraphStats::kernels.
int64_t count_kernel_nodes(cudaGraph_t graph) {
  size_t n = 0;
  CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  if (n > 0) CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &n));
  int64_t kernels = 0;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type;
    CUDA_CHECK(cudaGraphNodeGetType(node, &type));
    kernels += type == cudaGraphNodeTypeKernel;
  }
  return kernels;
}

}  // namespace

GraphRecorder::~GraphRecorder() {
  for (auto& [h, g] : graphs_) cudaGraphExecDestroy(g.exec);
  for (const Profiled& e : profiled_) {
    cudaEventDestroy(e.start);
    cudaEventDestroy(e.stop);
  }
}

void GraphRecorder::flush(const Launch& launch, int64_t step_start_ns) {
  if (!graph_mode_ || pending_.empty()) return;
  const int64_t flush_start = host_now_ns();
  launch_pending(launch);
  const int64_t now = host_now_ns();
  stats_.flush_ns += now - flush_start;
  stats_.record_ns += now - step_start_ns;
  ++stats_.recorded_steps;
}

void GraphRecorder::flush_segment(const Launch& launch) {
  if (!graph_mode_ || pending_.empty()) return;
  const int64_t flush_start = host_now_ns();
  launch_pending(launch);
  ++stats_.segments;
  stats_.flush_ns += host_now_ns() - flush_start;
}

void GraphRecorder::launch_pending(const Launch& launch) {
  const int64_t start = host_now_ns();
  const size_t h = signature_hash(signature_);
  auto it = graphs_.find(h);
  if (it != graphs_.end() && it->second.signature == signature_) {
    CUDA_CHECK(cudaGraphLaunch(it->second.exec, launch.stream));
    ++stats_.replays;
    stats_.kernels += it->second.kernels;
  } else {
    if (explain_captures_ && stats_.captures < 64) explain_capture();
    cudaGraph_t graph = nullptr;
    // Capture may begin while earlier segments of the step still run on the stream: it records,
    // and the graph launched below runs after them in stream order.
    CUDA_CHECK(cudaStreamBeginCapture(launch.stream, cudaStreamCaptureModeThreadLocal));
    const Launch side{side_stream_, false};  // as CudaBackend::record launches there
    for (const Pending& l : pending_)
      l.run(signature_.data() + l.offset, l.fn, l.side ? side : launch);
    CUDA_CHECK(cudaStreamEndCapture(launch.stream, &graph));
    const int64_t kernels = count_kernel_nodes(graph);
    cudaGraphExec_t exec = nullptr;
    CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    CUDA_CHECK(cudaGraphDestroy(graph));
    if (it != graphs_.end()) {
      cudaGraphExecDestroy(it->second.exec);
    } else if (graphs_.size() >= kMaxGraphs) {
      // Serving meets many step shapes (batch sizes x context buckets): keep memory bounded by
      // starting over; the shapes in use are captured again on their next step. Launched
      // segments of this step may still run: their graphs go once the stream is idle.
      CUDA_CHECK(cudaStreamSynchronize(launch.stream));
      drop_graphs();
    }
    graphs_[h] = Graph{signature_, exec, kernels};
    CUDA_CHECK(cudaGraphLaunch(exec, launch.stream));
    ++stats_.captures;
    stats_.kernels += kernels;
    stats_.capture_ns += host_now_ns() - start;
  }
  stats_.launches += int64_t(pending_.size());
  pending_.clear();
  signature_.clear();
  last_op_ = kOpNone;
}

void GraphRecorder::explain_capture() const {
  // The captured signature of the same size sharing the longest prefix with this one.
  const Graph* best = nullptr;
  size_t common = 0;
  for (const auto& [h, g] : graphs_) {
    if (g.signature.size() != signature_.size()) continue;
    const size_t n =
        size_t(std::mismatch(signature_.begin(), signature_.end(), g.signature.begin()).first -
               signature_.begin());
    if (best == nullptr || n > common) {
      best = &g;
      common = n;
    }
  }
  if (best == nullptr) {
    LOG_INFO("graph capture #{}: a new step shape ({} launches, {} signature bytes; {} graphs)",
             stats_.captures + 1, pending_.size(), signature_.size(), graphs_.size());
    return;
  }
  // The launch holding the first differing byte: the last one starting at or before it.
  size_t i = 0;
  while (i + 1 < pending_.size() && pending_[i + 1].offset - sizeof(int) <= common) ++i;
  int op = 0;
  std::memcpy(&op, signature_.data() + pending_[i].offset - sizeof(int), sizeof op);
  const size_t at = common >= pending_[i].offset ? common - pending_[i].offset : 0;
  uint64_t was = 0, now = 0;
  const size_t w = (common / 8) * 8;
  std::memcpy(&was, best->signature.data() + w, std::min<size_t>(8, signature_.size() - w));
  std::memcpy(&now, signature_.data() + w, std::min<size_t>(8, signature_.size() - w));
  LOG_INFO(
      "graph capture #{}: launch {} of {} ({}) differs from a captured step at parameter byte {} "
      "(8-byte word {:#x} was {:#x}); {} graphs",
      stats_.captures + 1, i, pending_.size(), op_name(op & (kSideLaneBit - 1)), at, now, was,
      graphs_.size());
}

void GraphRecorder::drop_graphs() {
  for (auto& [h, g] : graphs_) cudaGraphExecDestroy(g.exec);
  graphs_.clear();
}

void GraphRecorder::set_profile(bool on) {
  profile_ = on;
  profile_ms_.clear();
}

void GraphRecorder::collect_profile() {
  for (const Profiled& e : profiled_) {
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, e.start, e.stop));
    auto& acc = profile_ms_[e.op];
    acc.first += ms;
    ++acc.second;
    cudaEventDestroy(e.start);
    cudaEventDestroy(e.stop);
  }
  profiled_.clear();
}

std::string GraphRecorder::profile_report(int steps) const {
  std::vector<std::pair<int, std::pair<double, int64_t>>> rows(profile_ms_.begin(),
                                                               profile_ms_.end());
  std::sort(rows.begin(), rows.end(),
            [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
  double total = 0;
  for (auto& r : rows) total += r.second.first;
  std::string out;
  for (auto& [op, v] : rows)
    out += fmt::format(
        "profile  {:<14} {:8.1f} us/step  {:5.1f} launches/step  {:6.2f} us/launch  {:5.1f}%\n",
        op_name(op), 1e3 * v.first / steps, double(v.second) / steps,
        1e3 * v.first / double(v.second), 100.0 * v.first / total);
  out += fmt::format("profile  total          {:8.1f} us/step\n", 1e3 * total / steps);
  return out;
}

}  // namespace strata::cuda
