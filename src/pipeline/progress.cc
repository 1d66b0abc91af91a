#include "pipeline/progress.h"

#include <fmt/format.h>

#include <algorithm>

namespace strata {

void RateWindow::add(double t_s, double cumulative) {
  samples_.emplace_back(t_s, cumulative);
  // Keep one sample at or before the window's start, so the span covers the whole window.
  while (samples_.size() > 2 && samples_[1].first <= t_s - window_s_) samples_.pop_front();
}

double RateWindow::span_s() const {
  return samples_.size() < 2 ? 0 : samples_.back().first - samples_.front().first;
}

double RateWindow::rate() const {
  const double span = span_s();
  return span > 0 ? (samples_.back().second - samples_.front().second) / span : 0;
}

std::string format_duration(double s) {
  if (!(s >= 0) || s > 1e9) return "?";
  const int64_t t = int64_t(s + 0.5);
  if (t < 60) return fmt::format("{}s", t);
  if (t < 3600) return fmt::format("{}m{:02}s", t / 60, t % 60);
  if (t < 86400) return fmt::format("{}h{:02}m", t / 3600, (t % 3600) / 60);
  return fmt::format("{}d{:02}h", t / 86400, (t % 86400) / 3600);
}

std::string format_progress(const ProgressSnapshot& p) {
  std::string line = p.shard.empty() ? "[generate]" : fmt::format("[generate shard {}]", p.shard);
  int64_t total = 0, finished = 0, failed = 0, generated = 0, running = 0;
  for (const auto& d : p.datasets) {
    const int64_t f = d.done_before + d.done + d.failed;
    line += fmt::format(" {} {}/{}", d.name, f, d.total);
    if (d.failed > 0) line += fmt::format(" ({} failed)", d.failed);
    if (p.datasets.size() > 1) line += fmt::format(" {} tok", d.generated_tokens);
    line += " ·";
    total += d.total;
    finished += f;
    failed += d.failed;
    generated += d.generated_tokens;
    running += d.running;
  }
  line += fmt::format(" total {}/{} ({:.1f}%)", finished, total,
                      total ? 100.0 * double(finished) / double(total) : 100.0);
  if (p.datasets.size() == 1 && failed > 0) line += fmt::format(" {} failed", failed);
  if (running > 0) line += fmt::format(" {} running", running);
  line += fmt::format(" · {} tok generated", generated);
  if (!p.target_note.empty()) line += " · " + p.target_note;
  line += fmt::format(" · gen {:.0f} tok/s · prompt {:.0f} tok/s", p.gen_tokens_per_s,
                      p.prompt_tokens_per_s);
  if (p.window_s > 0) line += fmt::format(" (last {})", format_duration(p.window_s));
  if (finished == total) {
    line += fmt::format(" · elapsed {}", format_duration(p.elapsed_s));
  } else if (p.tokens_left >= 0 && p.gen_tokens_per_s > 0) {
    line += fmt::format(" · ETA {}", format_duration(double(p.tokens_left) / p.gen_tokens_per_s));
  } else {
    line += " · ETA ?";
  }
  return line;
}

}  // namespace strata
