#include "server/metrics.h"

#include <fmt/format.h>

#include <cctype>
#include <cmath>

#include "core/check.h"

namespace strata {
namespace {

std::string escape_label_value(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

std::string escape_help(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

// Prometheus float formatting: integers without a fraction, +Inf/-Inf/NaN spelled out.
std::string format_value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::floor(v) && std::fabs(v) < 1e15) return fmt::format("{}", int64_t(v));
  return fmt::format("{}", v);
}

bool valid_metric_name(const std::string& n) {
  if (n.empty() || std::isdigit(static_cast<unsigned char>(n[0]))) return false;
  for (char c : n)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == ':')) return false;
  return true;
}

std::string render_labels(const MetricsRegistry::Labels& labels) {
  std::string out;
  for (const auto& [k, v] : labels) {
    CHECK_MSG(valid_metric_name(k) && k.find(':') == std::string::npos, "bad label name");
    if (!out.empty()) out += ",";
    out += fmt::format("{}=\"{}\"", k, escape_label_value(v));
  }
  return out;
}

}  // namespace

void Counter::inc(double v) {
  CHECK_MSG(v >= 0, "counters only go up");
  double cur = value_.load(std::memory_order_relaxed);
  while (!value_.compare_exchange_weak(cur, cur + v, std::memory_order_relaxed)) {
  }
}

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {
  for (size_t i = 1; i < bounds_.size(); ++i) CHECK_MSG(bounds_[i - 1] < bounds_[i], "bounds must ascend");
}

void Histogram::observe(double v) {
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  std::lock_guard<std::mutex> lk(mu_);
  ++counts_[i];
  sum_ += v;
  ++count_;
}

Histogram::Snapshot Histogram::snapshot() const {
  Snapshot s;
  s.bounds = bounds_;
  std::lock_guard<std::mutex> lk(mu_);
  uint64_t acc = 0;
  for (uint64_t c : counts_) s.cumulative.push_back(acc += c);
  s.sum = sum_;
  s.count = count_;
  return s;
}

MetricsRegistry::MetricsRegistry(Labels labels) : labels_(render_labels(labels)) {}

MetricsRegistry::Entry& MetricsRegistry::add(const std::string& name, const std::string& help, Kind kind,
                                             const Labels& series) {
  CHECK_MSG(valid_metric_name(name), "bad metric name");
  std::lock_guard<std::mutex> lk(mu_);
  auto e = std::make_unique<Entry>();
  e->name = name;
  e->help = help;
  e->series = render_labels(series);
  e->kind = kind;
  for (const auto& other : entries_) {
    if (other->name != name) continue;
    CHECK_MSG(other->series != e->series, "metric registered twice");
    CHECK_MSG(!other->series.empty() && !e->series.empty() && other->kind == kind && other->help == help,
              "the series of one metric name differ in kind or help");
  }
  entries_.push_back(std::move(e));
  return *entries_.back();
}

Counter& MetricsRegistry::counter(const std::string& name, const std::string& help) {
  Entry& e = add(name, help, Kind::kCounter);
  e.counter = std::make_unique<Counter>();
  return *e.counter;
}

Gauge& MetricsRegistry::gauge(const std::string& name, const std::string& help) {
  Entry& e = add(name, help, Kind::kGauge);
  e.gauge = std::make_unique<Gauge>();
  return *e.gauge;
}

Counter& MetricsRegistry::counter(const std::string& name, const std::string& help, const Labels& series) {
  Entry& e = add(name, help, Kind::kCounter, series);
  e.counter = std::make_unique<Counter>();
  return *e.counter;
}

Gauge& MetricsRegistry::gauge(const std::string& name, const std::string& help, const Labels& series) {
  Entry& e = add(name, help, Kind::kGauge, series);
  e.gauge = std::make_unique<Gauge>();
  return *e.gauge;
}

Histogram& MetricsRegistry::histogram(const std::string& name, const std::string& help,
                                      std::vector<double> bounds) {
  Entry& e = add(name, help, Kind::kHistogram);
  e.histogram = std::make_unique<Histogram>(std::move(bounds));
  return *e.histogram;
}

std::string MetricsRegistry::label_block(const std::string& extra) const {
  std::string inner = labels_;
  if (!extra.empty()) inner += (inner.empty() ? "" : ",") + extra;
  return inner.empty() ? "" : "{" + inner + "}";
}

std::string MetricsRegistry::render() const {
  std::string out;
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<bool> done(entries_.size(), false);
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (done[i]) continue;
    const Entry& head = *entries_[i];
    const char* type = head.kind == Kind::kCounter ? "counter" : head.kind == Kind::kGauge ? "gauge" : "histogram";
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", head.name, escape_help(head.help), head.name, type);
    // Every series of this name, under the one header (Prometheus wants a family in one group).
    for (size_t j = i; j < entries_.size(); ++j) {
      if (entries_[j]->name != head.name) continue;
      done[j] = true;
      render_entry(*entries_[j], out);
    }
  }
  return out;
}

void MetricsRegistry::render_entry(const Entry& e, std::string& out) const {
  if (e.kind == Kind::kCounter) {
    out += fmt::format("{}{} {}\n", e.name, label_block(e.series), format_value(e.counter->value()));
  } else if (e.kind == Kind::kGauge) {
    out += fmt::format("{}{} {}\n", e.name, label_block(e.series), format_value(e.gauge->value()));
  } else {
    const Histogram::Snapshot s = e.histogram->snapshot();
    for (size_t i = 0; i <= s.bounds.size(); ++i) {
      const std::string le = i < s.bounds.size() ? format_value(s.bounds[i]) : "+Inf";
      out += fmt::format("{}_bucket{} {}\n", e.name, label_block("le=\"" + le + "\""), s.cumulative[i]);
    }
    out += fmt::format("{}_sum{} {}\n", e.name, label_block(""), format_value(s.sum));
    out += fmt::format("{}_count{} {}\n", e.name, label_block(""), s.count);
  }
}

std::vector<double> latency_buckets_seconds() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
          0.75,  1.0,    2.5,   5.0,  7.5,   10.0, 15.0,  20.0, 30.0, 60.0, 120.0};
}

}  // namespace strata
