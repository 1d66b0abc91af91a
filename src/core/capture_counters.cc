#include "core/capture_counters.h"

#include <fmt/format.h>

namespace strata {

CaptureCounters& capture_counters() {
  static CaptureCounters counters;
  return counters;
}

std::string CaptureCounters::summary() const {
  std::string out;
  auto one = [&](const char* name, const CaptureCounter& c) {
    const double s = c.seconds(), gb = double(c.bytes.load(std::memory_order_relaxed)) * 1e-9;
    out += fmt::format("{}{} {} x, {:.2f} s (longest {:.3f} s), {:.2f} GB ({:.2f} GB/s)",
                       out.empty() ? "" : "; ", name, c.count.load(std::memory_order_relaxed), s,
                       c.max_seconds(), gb, s > 0 ? gb / s : 0.0);
  };
  one("download", download);
  one("scatter", scatter);
  one("queue_wait", queue_wait);
  one("fence_wait", fence_wait);
  one("spill", spill);
  one("write", write);
  one("sync", sync);
  one("index", index);
  if (const int64_t e = spill_errors.load(std::memory_order_relaxed); e > 0)
    out += fmt::format("; {} failed spill writes", e);
  return out;
}

}  // namespace strata
