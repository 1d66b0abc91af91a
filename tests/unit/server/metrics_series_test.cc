// Labelled series of one metric (the host tier's per-rank counters): one HELP/TYPE header per
// name with every series under it, even when registered apart; a series twice, or series of one
// name that disagree in kind or help, are programming errors.
#include <gtest/gtest.h>

#include "server/metrics.h"

namespace strata {
namespace {

TEST(MetricsSeriesTest, OneHeaderPerNameWithEverySeriesUnderIt) {
  MetricsRegistry reg(MetricsRegistry::Labels{{"model_name", "m"}});
  reg.counter("a_total", "per rank", {{"rank", "0"}}).inc(1);
  reg.gauge("b_bytes", "plain").set(7);
  reg.counter("a_total", "per rank", {{"rank", "1"}}).inc(2);
  const std::string t = reg.render();
  EXPECT_EQ(t,
            "# HELP a_total per rank\n# TYPE a_total counter\n"
            "a_total{model_name=\"m\",rank=\"0\"} 1\n"
            "a_total{model_name=\"m\",rank=\"1\"} 2\n"
            "# HELP b_bytes plain\n# TYPE b_bytes gauge\n"
            "b_bytes{model_name=\"m\"} 7\n");
}

TEST(MetricsSeriesDeathTest, ConflictingSeriesAreProgrammingErrors) {
  EXPECT_DEATH(
      {
        MetricsRegistry reg;
        reg.counter("a_total", "h", {{"rank", "0"}});
        reg.counter("a_total", "h", {{"rank", "0"}});
      },
      "registered twice");
  EXPECT_DEATH(
      {
        MetricsRegistry reg;
        reg.counter("a_total", "h", {{"rank", "0"}});
        reg.gauge("a_total", "h", {{"rank", "1"}});
      },
      "differ in kind or help");
  EXPECT_DEATH(
      {
        MetricsRegistry reg;
        reg.counter("a_total", "h");
        reg.counter("a_total", "h", {{"rank", "1"}});
      },
      "differ in kind or help");
}

}  // namespace
}  // namespace strata
