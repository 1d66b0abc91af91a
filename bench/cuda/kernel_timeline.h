// A decode step's kernels as the GPU ran them under CUDA graphs and PDL: every kernel's start and
// end from CUPTI's activity records (CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: kernels are not
// serialized, so a kernel launched early by PDL overlaps its predecessor as in production).
//
// ## Why
// ncu serializes kernels, so its per-kernel times (decode_profile.sh) add each kernel's ramp and
// tail and say nothing of what PDL hides: a Kimi-K2.5 rank's batch-1 step summed 6.98 ms of
// kernels against a 5.24 ms graph wall (2026-12-03). This timeline attributes the wall itself:
// sorted by end time, each kernel is charged the time by which it moved the step's last end
// ("end increment"); the increments add up to the step's wall (first start to last end), so the
// table says which kernels the step actually waits on. Where streams overlap, a side branch's
// kernel that ends while a main-stream kernel runs takes part of that kernel's increment: read
// the main path from the listing (--timeline 2). CUPTI slows the host's graph launches (a
// 64-launch segment's cudaGraphLaunch took 140-300 us with it on, session 15), so holes at segment
// boundaries in a traced step can be CUPTI's own; kernel durations and increments inside a
// segment are the ones to trust — except across streams: with CUPTI on, a short side-branch
// kernel can end later than it does untraced, so a side-stream kernel's increment is a lead to
// check with the plain graph's step time, not a measurement (2026-12-05: the shared experts'
// down GEMV showed ~12 us a Kimi-K2.5 layer; folded into the combine, the untraced step moved
// ±0.0%, bench/results/2026-12-05-session34.md).
//
// Use: timeline_begin() before the first graph-mode step (CUPTI traces the nodes of graphs
// instantiated after it), run the steps, timeline_mark() right before the step to analyse (after
// a synchronize), run it, then timeline_end() returns that step's kernels. Header only: every
// .cc under bench/cuda/ is its own program (CMakeLists.txt), and the benches that include this
// link CUDA::cupti.
#pragma once

#include <cupti.h>
#include <cxxabi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace strata::bench {

struct TimelineKernel {
  std::string name;  // demangled, namespaces and parameter list dropped
  uint64_t start = 0, end = 0;
  uint32_t stream = 0;
  int32_t grid = 0, block = 0;  // x·y·z of each
  uint32_t correlation = 0;     // of the runtime call that launched it (a graph's: its launch)
};
// A CUDA runtime call of the host thread (cudaGraphLaunch, cudaMemcpyAsync, ...), on the same
// clock as the kernels: when the host handed the device each part of the step; or (device) a
// copy the device ran (graph memcpy nodes included).
struct TimelineApi {
  std::string name;
  uint64_t start = 0, end = 0;
  uint32_t correlation = 0;
  bool device = false;
};
struct Timeline {
  std::vector<TimelineKernel> kernels;  // by start
  std::vector<TimelineApi> api;         // by start
};

namespace timeline_detail {

inline std::mutex& mu() {
  static std::mutex m;
  return m;
}
inline Timeline& records() {
  static Timeline r;
  return r;
}
inline uint64_t& mark() {
  static uint64_t t = 0;
  return t;
}

inline std::string short_name(const char* mangled) {
  if (mangled == nullptr) return "?";
  int status = 0;
  char* d = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string s = status == 0 && d != nullptr ? d : mangled;
  std::free(d);
  // Namespaces go, then the parameter list (the first '(' outside template arguments).
  for (const char* ns : {"(anonymous namespace)::", "strata::cuda::", "strata::", "void "}) {
    for (size_t p; (p = s.find(ns)) != std::string::npos;)
      s.erase(p, std::char_traits<char>::length(ns));
  }
  int depth = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '<') ++depth;
    if (s[i] == '>') --depth;
    if (s[i] == '(' && depth == 0 && i > 0) {
      s.resize(i);
      break;
    }
  }
  return s;
}

inline void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *size = size_t(8) << 20;
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, *size));
  *max_records = 0;
}

inline void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* rec = nullptr;
  std::lock_guard<std::mutex> lock(mu());
  while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    if (rec->kind == CUPTI_ACTIVITY_KIND_RUNTIME) {
      const auto* a = reinterpret_cast<const CUpti_ActivityAPI*>(rec);
      if (a->start < mark()) continue;
      const char* name = nullptr;
      cuptiGetCallbackName(CUPTI_CB_DOMAIN_RUNTIME_API, a->cbid, &name);
      records().api.push_back(TimelineApi{.name = name ? name : "?",
                                          .start = a->start,
                                          .end = a->end,
                                          .correlation = a->correlationId});
      continue;
    }
    if (rec->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      const auto* c = reinterpret_cast<const CUpti_ActivityMemcpy6*>(rec);
      if (c->start < mark()) continue;
      records().api.push_back(TimelineApi{
          .name = "memcpy " + std::to_string(c->bytes) + " B, kind " + std::to_string(c->copyKind),
          .start = c->start,
          .end = c->end,
          .correlation = c->correlationId,
          .device = true});
      continue;
    }
    if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL &&
        rec->kind != CUPTI_ACTIVITY_KIND_KERNEL)
      continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
    if (k->start < mark()) continue;
    records().kernels.push_back(TimelineKernel{.name = short_name(k->name),
                                               .start = k->start,
                                               .end = k->end,
                                               .stream = k->streamId,
                                               .grid = k->gridX * k->gridY * k->gridZ,
                                               .block = k->blockX * k->blockY * k->blockZ,
                                               .correlation = k->correlationId});
  }
  std::free(buffer);
}

inline bool check(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return true;
  const char* msg = nullptr;
  cuptiGetResultString(r, &msg);
  std::fprintf(stderr, "timeline: %s failed: %s\n", what, msg ? msg : "?");
  return false;
}

}  // namespace timeline_detail

// Starts recording kernels (before the graphs to trace are instantiated). False, with the reason
// on stderr, where CUPTI refuses.
inline bool timeline_begin() {
  using namespace timeline_detail;
  return check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed),
               "cuptiActivityRegisterCallbacks") &&
         check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "cuptiActivityEnable") &&
         check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME), "cuptiActivityEnable(runtime)") &&
         check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY), "cuptiActivityEnable(memcpy)");
}

// Kernels that start from now on are the ones timeline_end returns (call after a synchronize).
inline void timeline_mark() {
  using namespace timeline_detail;
  cuptiActivityFlushAll(1);
  std::lock_guard<std::mutex> lock(mu());
  records() = Timeline{};
  uint64_t t = 0;
  cuptiGetTimestamp(&t);
  mark() = t;
}

// Stops recording; the kernels and runtime calls since timeline_mark, by start time (call after
// a synchronize).
inline Timeline timeline_end() {
  using namespace timeline_detail;
  cuptiActivityFlushAll(1);
  cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  cuptiActivityDisable(CUPTI_ACTIVITY_KIND_RUNTIME);
  cuptiActivityDisable(CUPTI_ACTIVITY_KIND_MEMCPY);
  cuptiActivityFlushAll(1);
  std::lock_guard<std::mutex> lock(mu());
  Timeline r = std::move(records());
  records() = Timeline{};
  auto by_start = [](const auto& a, const auto& b) { return a.start < b.start; };
  std::sort(r.kernels.begin(), r.kernels.end(), by_start);
  std::sort(r.api.begin(), r.api.end(), by_start);
  return r;
}

// Prints the step: its wall, the sum of kernel durations, the time no kernel ran; the kernels by
// name and grid (count, µs of duration, µs of end increment, its mean and median, sorted by the
// increment; the top `top`);
// with `all`, every kernel, runtime call and copy in start order (times from the first kernel's
// start; a host call's row gives its host duration).
inline void timeline_print(const Timeline& tl, const char* label, int top, bool all) {
  const std::vector<TimelineKernel>& k = tl.kernels;
  if (k.empty()) {
    std::printf("timeline %s: no kernels recorded\n", label);
    return;
  }
  const uint64_t t0 = k.front().start;
  std::vector<size_t> by_end(k.size());
  for (size_t i = 0; i < k.size(); ++i) by_end[i] = i;
  std::sort(by_end.begin(), by_end.end(), [&](size_t a, size_t b) { return k[a].end < k[b].end; });
  std::vector<double> inc(k.size(), 0.0);
  uint64_t last = t0, busy_until = t0;
  double idle = 0.0, sum = 0.0;
  for (size_t i : by_end) {
    if (k[i].end > last) {
      inc[i] = double(k[i].end - last) * 1e-3;
      last = k[i].end;
    }
  }
  for (const TimelineKernel& x : k) {  // by start: gaps where no kernel was running
    if (x.start > busy_until) idle += double(x.start - busy_until) * 1e-3;
    busy_until = std::max(busy_until, x.end);
    sum += double(x.end - x.start) * 1e-3;
  }
  double api_busy = 0.0;
  for (const TimelineApi& a : tl.api)
    if (!a.device) api_busy += double(a.end - a.start) * 1e-3;
  std::printf(
      "timeline %s: %zu kernels, wall %.1f us (first start to last end), kernel sum %.1f us, no "
      "kernel running %.1f us; %zu runtime calls, %.1f us in them\n",
      label, k.size(), double(last - t0) * 1e-3, sum, idle, tl.api.size(), api_busy);
  // By name and grid (one kernel serves several shapes: the GEMVs of q_a, o_proj, ...): the
  // median increment is the typical layer's (the mean also carries the step's one-off holes).
  struct Agg {
    int n = 0;
    double dur = 0, inc = 0;
    std::vector<double> incs;
  };
  std::map<std::string, Agg> agg;
  for (size_t i = 0; i < k.size(); ++i) {
    Agg& a = agg[k[i].name + " [" + std::to_string(k[i].grid) + "]"];
    ++a.n;
    a.dur += double(k[i].end - k[i].start) * 1e-3;
    a.inc += inc[i];
    a.incs.push_back(inc[i]);
  }
  std::vector<std::pair<std::string, Agg>> rows(agg.begin(), agg.end());
  std::sort(rows.begin(), rows.end(),
            [](const auto& a, const auto& b) { return a.second.inc > b.second.inc; });
  std::printf("  %-70s %5s %10s %10s %8s %8s\n", "kernel [grid]", "count", "dur us", "incr us",
              "incr/n", "median");
  for (size_t i = 0; i < rows.size() && int(i) < top; ++i) {
    std::vector<double>& v = rows[i].second.incs;
    std::nth_element(v.begin(), v.begin() + long(v.size() / 2), v.end());
    std::printf("  %-70.70s %5d %10.1f %10.1f %8.2f %8.2f\n", rows[i].first.c_str(),
                rows[i].second.n, rows[i].second.dur, rows[i].second.inc,
                rows[i].second.inc / rows[i].second.n, v[v.size() / 2]);
  }
  if (!all) return;
  std::printf("  %5s %9s %8s %8s %6s %6s %5s %6s  %s\n", "#", "start us", "dur us", "incr us",
              "grid", "block", "strm", "corr", "kernel / runtime call");
  auto at = [&](uint64_t t) { return (double(t) - double(t0)) * 1e-3; };
  size_t j = 0;
  for (size_t i = 0; i <= k.size(); ++i) {
    for (; j < tl.api.size() && (i == k.size() || tl.api[j].start <= k[i].start); ++j)
      std::printf("  %5s %9.1f %8.2f %8s %6s %6s %5s %6u  [%s] %s\n", "", at(tl.api[j].start),
                  double(tl.api[j].end - tl.api[j].start) * 1e-3, "", "", "", "",
                  tl.api[j].correlation, tl.api[j].device ? "gpu" : "host", tl.api[j].name.c_str());
    if (i == k.size()) break;
    std::printf("  %5zu %9.1f %8.2f %8.2f %6d %6d %5u %6u  %.90s\n", i, at(k[i].start),
                double(k[i].end - k[i].start) * 1e-3, inc[i], k[i].grid, k[i].block, k[i].stream,
                k[i].correlation, k[i].name.c_str());
  }
}

}  // namespace strata::bench
