// A small Prometheus registry: counters, gauges and histograms rendered in the text exposition
// format (version 0.0.4). Every sample carries the registry's constant labels (e.g. model_name).
// Thread-safe: metrics are updated from HTTP threads and the engine thread's callbacks (an
// update is an atomic add or a short mutex hold); render() takes a consistent-enough snapshot.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace strata {

// A monotonically increasing value. set_total() mirrors a total kept elsewhere (the engine's).
class Counter {
 public:
  void inc(double v = 1.0);
  void set_total(double v) { value_.store(v, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

class Gauge {
 public:
  void set(double v) { value_.store(v, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// Cumulative buckets with upper bounds `bounds` (ascending) plus +Inf.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double v);
  struct Snapshot {
    std::vector<double> bounds;
    std::vector<uint64_t> cumulative;  // one per bound, then +Inf
    double sum = 0;
    uint64_t count = 0;
  };
  Snapshot snapshot() const;

 private:
  std::vector<double> bounds_;
  mutable std::mutex mu_;
  std::vector<uint64_t> counts_;  // per bucket (not cumulative), last is +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

// Counters of one name that differ in the value of one label: name{label="value"}.
class CounterFamily {
 public:
  explicit CounterFamily(std::string label) : label_(std::move(label)) {}
  // The counter of label value `value`, made on first use; it stays valid for the family's life.
  Counter& with(const std::string& value);
  const std::string& label() const { return label_; }
  // Every (value, counter) made so far, in the order they were made.
  std::vector<std::pair<std::string, double>> snapshot() const;

 private:
  std::string label_;
  mutable std::mutex mu_;
  std::vector<std::pair<std::string, std::unique_ptr<Counter>>> counters_;
};

// Owns the metrics; references returned by counter()/gauge()/histogram()/counter_family() stay
// valid for the registry's lifetime. Names must follow Prometheus rules (counters end in _total).
class MetricsRegistry {
 public:
  // `labels`: constant labels on every sample, e.g. {{"model_name", "house-llama"}}.
  explicit MetricsRegistry(std::vector<std::pair<std::string, std::string>> labels = {});

  Counter& counter(const std::string& name, const std::string& help);
  Gauge& gauge(const std::string& name, const std::string& help);
  Histogram& histogram(const std::string& name, const std::string& help,
                       std::vector<double> bounds);
  // One sample per label value, in the order the values were first used (none: HELP and TYPE only).
  CounterFamily& counter_family(const std::string& name, const std::string& help,
                                const std::string& label);

  // The text exposition format, metrics in registration order.
  std::string render() const;

 private:
  enum class Kind { kCounter, kGauge, kHistogram, kCounterFamily };
  struct Entry {
    std::string name, help;
    Kind kind;
    std::unique_ptr<Counter> counter;
    std::unique_ptr<Gauge> gauge;
    std::unique_ptr<Histogram> histogram;
    std::unique_ptr<CounterFamily> family;
  };
  Entry& add(const std::string& name, const std::string& help, Kind kind);
  std::string label_block(const std::string& extra) const;

  std::string labels_;  // rendered constant labels: k="v",k2="v2" (no braces)
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Entry>> entries_;
};

// Exponential-ish bucket bounds in seconds for latencies.
std::vector<double> latency_buckets_seconds();

}  // namespace strata
