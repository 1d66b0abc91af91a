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
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

std::string escape_help(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
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

}  // namespace

void Counter::inc(double v) {
  CHECK_MSG(v >= 0, "counters only go up");
  double cur = value_.load(std::memory_order_relaxed);
  while (!value_.compare_exchange_weak(cur, cur + v, std::memory_order_relaxed)) {
  }
}

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {
  for (size_t i = 1; i < bounds_.size(); ++i)
    CHECK_MSG(bounds_[i - 1] < bounds_[i], "bounds must ascend");
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

Counter& CounterFamily::with(const std::string& value) {
  std::lock_guard<std::mutex> lk(mu_);
  for (auto& [v, c] : counters_)
    if (v == value) return *c;
  counters_.emplace_back(value, std::make_unique<Counter>());
  return *counters_.back().second;
}

std::vector<std::pair<std::string, double>> CounterFamily::snapshot() const {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<std::pair<std::string, double>> out;
  for (const auto& [v, c] : counters_) out.emplace_back(v, c->value());
  return out;
}

MetricsRegistry::MetricsRegistry(std::vector<std::pair<std::string, std::string>> labels) {
  for (const auto& [k, v] : labels) {
    if (!labels_.empty()) labels_ += ",";
    labels_ += fmt::format("{}=\"{}\"", k, escape_label_value(v));
  }
}

MetricsRegistry::Entry& MetricsRegistry::add(const std::string& name, const std::string& help,
                                             Kind kind) {
  CHECK_MSG(valid_metric_name(name), "bad metric name");
  std::lock_guard<std::mutex> lk(mu_);
  for (const auto& e : entries_) CHECK_MSG(e->name != name, "metric registered twice");
  auto e = std::make_unique<Entry>();
  e->name = name;
  e->help = help;
  e->kind = kind;
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

Histogram& MetricsRegistry::histogram(const std::string& name, const std::string& help,
                                      std::vector<double> bounds) {
  Entry& e = add(name, help, Kind::kHistogram);
  e.histogram = std::make_unique<Histogram>(std::move(bounds));
  return *e.histogram;
}

CounterFamily& MetricsRegistry::counter_family(const std::string& name, const std::string& help,
                                               const std::string& label) {
  CHECK_MSG(valid_metric_name(label), "bad label name");
  Entry& e = add(name, help, Kind::kCounterFamily);
  e.family = std::make_unique<CounterFamily>(label);
  return *e.family;
}

std::string MetricsRegistry::label_block(const std::string& extra) const {
  std::string inner = labels_;
  if (!extra.empty()) inner += (inner.empty() ? "" : ",") + extra;
  return inner.empty() ? "" : "{" + inner + "}";
}

std::string MetricsRegistry::render() const {
  std::string out;
  std::lock_guard<std::mutex> lk(mu_);
  for (const auto& e : entries_) {
    const char* type = e->kind == Kind::kCounter || e->kind == Kind::kCounterFamily ? "counter"
                       : e->kind == Kind::kGauge                                    ? "gauge"
                                                                                    : "histogram";
    out +=
        fmt::format("# HELP {} {}\n# TYPE {} {}\n", e->name, escape_help(e->help), e->name, type);
    if (e->kind == Kind::kCounter) {
      out += fmt::format("{}{} {}\n", e->name, label_block(""), format_value(e->counter->value()));
    } else if (e->kind == Kind::kGauge) {
      out += fmt::format("{}{} {}\n", e->name, label_block(""), format_value(e->gauge->value()));
    } else if (e->kind == Kind::kCounterFamily) {
      for (const auto& [value, v] : e->family->snapshot())
        out += fmt::format(
            "{}{} {}\n", e->name,
            label_block(fmt::format("{}=\"{}\"", e->family->label(), escape_label_value(value))),
            format_value(v));
    } else {
      const Histogram::Snapshot s = e->histogram->snapshot();
      for (size_t i = 0; i <= s.bounds.size(); ++i) {
        const std::string le = i < s.bounds.size() ? format_value(s.bounds[i]) : "+Inf";
        out += fmt::format("{}_bucket{} {}\n", e->name, label_block("le=\"" + le + "\""),
                           s.cumulative[i]);
      }
      out += fmt::format("{}_sum{} {}\n", e->name, label_block(""), format_value(s.sum));
      out += fmt::format("{}_count{} {}\n", e->name, label_block(""), s.count);
    }
  }
  return out;
}

std::vector<double> latency_buckets_seconds() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1,  0.15, 0.2,  0.3,  0.4,
          0.5,   0.75,   1.0,   2.5,  5.0,   7.5,  10.0,  15.0, 20.0, 30.0, 60.0, 120.0};
}

}  // namespace strata
