// The /metrics text of the CPU-fallback counters (strata_cpu_fallback_ops_total{op}) and of
// labelled counter families in general, with a fake backend that reports fallback counts the way
// the CUDA backend's CPU-twin table does (every declared op, zeros included).
#include "server/metrics.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "server/server_state.h"

namespace strata {
namespace {

// The CPU backend plus a declared table of fallback ops with settable counts.
class FakeFallbackBackend : public cpu::CpuBackend {
 public:
  std::vector<std::pair<std::string, int64_t>> cpu_fallback_counts() const override {
    return counts;
  }
  std::vector<std::pair<std::string, int64_t>> counts = {
      {"mla_attention", 0}, {"moe_route", 0}, {"moe_experts", 0}, {"linear_f32_out", 0}};
};

bool has_line(const std::string& text, const std::string& line) {
  return ("\n" + text).find("\n" + line + "\n") != std::string::npos;
}

TEST(CpuFallbackMetrics, EveryDeclaredOpIsExportedZerosIncluded) {
  FakeFallbackBackend backend;
  ServerMetrics m("house", backend.cpu_fallback_counts());
  const std::string text = m.registry.render();
  EXPECT_TRUE(has_line(text, "# TYPE strata_cpu_fallback_ops_total counter")) << text;
  for (const char* op : {"mla_attention", "moe_route", "moe_experts", "linear_f32_out"})
    EXPECT_TRUE(has_line(
        text,
        std::string("strata_cpu_fallback_ops_total{model_name=\"house\",op=\"") + op + "\"} 0"))
        << op << "\n"
        << text;
}

TEST(CpuFallbackMetrics, CountsFollowTheBackend) {
  FakeFallbackBackend backend;
  ServerMetrics m("house", backend.cpu_fallback_counts());
  backend.counts[0].second = 3;      // mla_attention
  backend.counts[2].second = 12345;  // moe_experts
  m.set_cpu_fallback_counts(backend.cpu_fallback_counts());
  const std::string text = m.registry.render();
  EXPECT_TRUE(
      has_line(text, "strata_cpu_fallback_ops_total{model_name=\"house\",op=\"mla_attention\"} 3"))
      << text;
  EXPECT_TRUE(has_line(
      text, "strata_cpu_fallback_ops_total{model_name=\"house\",op=\"moe_experts\"} 12345"))
      << text;
  EXPECT_TRUE(
      has_line(text, "strata_cpu_fallback_ops_total{model_name=\"house\",op=\"moe_route\"} 0"))
      << text;
  // The samples keep the table's order.
  EXPECT_LT(text.find("op=\"mla_attention\""), text.find("op=\"moe_route\""));
  EXPECT_LT(text.find("op=\"moe_experts\""), text.find("op=\"linear_f32_out\""));
}

TEST(CpuFallbackMetrics, AbsentWhenTheBackendHasNoTable) {
  auto cpu = make_cpu_backend();  // the reference itself: nothing falls back
  EXPECT_TRUE(cpu->cpu_fallback_counts().empty());
  ServerMetrics m("house", cpu->cpu_fallback_counts());
  m.set_cpu_fallback_counts({{"mla_attention", 7}});  // ignored: no table was declared
  const std::string text = m.registry.render();
  EXPECT_EQ(text.find("strata_cpu_fallback_ops_total"), std::string::npos) << text;
  EXPECT_EQ(m.cpu_fallback_ops, nullptr);
}

TEST(CounterFamily, RendersOneSamplePerLabelValueEscaped) {
  MetricsRegistry r(std::vector<std::pair<std::string, std::string>>{{"model_name", "m"}});
  CounterFamily& f = r.counter_family("x_total", "help", "op");
  EXPECT_EQ(r.render(), "# HELP x_total help\n# TYPE x_total counter\n");  // no values yet
  f.with("a").inc(2);
  f.with("q\"uote").set_total(5);
  f.with("a").inc();
  EXPECT_EQ(r.render(),
            "# HELP x_total help\n# TYPE x_total counter\n"
            "x_total{model_name=\"m\",op=\"a\"} 3\n"
            "x_total{model_name=\"m\",op=\"q\\\"uote\"} 5\n");
}

}  // namespace
}  // namespace strata
