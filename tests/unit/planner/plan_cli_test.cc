// `strata plan` end to end: the real binary on shared/configs, and the config parser feeding the
// planner the same numbers the hand-built specs give.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "model/config.h"
#include "model/inventory.h"
#include "planner/planner.h"

namespace strata {
namespace {

const std::string kConfigs = std::string(STRATA_SHARED_DIR) + "/configs/";

struct CliRun {
  int rc = 0;
  std::string out;  // stdout and stderr
};

CliRun run_plan(const std::string& args) {
  const std::string cmd = std::string(STRATA_BINARY) + " plan " + args + " 2>&1";
  CliRun r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return {-1, "popen failed"};
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int status = pclose(p);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

TEST(ConfigSpecs, TotalsFromSharedConfigs) {
  auto kimi = load_model_spec(kConfigs + "kimi-k2.5");
  ASSERT_TRUE(kimi.ok()) << kimi.status().to_string();
  InventorySummary s = summarize_inventory(*kimi, build_inventory(*kimi), 8);
  EXPECT_NEAR(double(s.total_params) / 1.026e12, 1.0, 0.005);
  EXPECT_NEAR(double(s.active_params) / 32.9e9, 1.0, 0.005);
  EXPECT_EQ(s.bytes_per_rank, 76182607872);

  auto dsv3 = load_model_spec(kConfigs + "deepseek-v3");
  ASSERT_TRUE(dsv3.ok()) << dsv3.status().to_string();
  s = summarize_inventory(*dsv3, build_inventory(*dsv3), 8);
  EXPECT_NEAR(double(s.total_params) / 671e9, 1.0, 0.005);  // MTP layer excluded
  EXPECT_NEAR(double(s.active_params) / 37e9, 1.0, 0.02);   // 37.55B; DeepSeek says "37B"

  auto llama = load_model_spec(kConfigs + "llama-3.1-8b");
  ASSERT_TRUE(llama.ok()) << llama.status().to_string();
  EXPECT_EQ(kv_bytes_per_token(*llama, 1, DType::kBF16), 131072);
  EXPECT_EQ(kv_bytes_per_token(*dsv3, 8, DType::kBF16), 70272);
  EXPECT_EQ(kv_bytes_per_token(*dsv3, 8, DType::kFP8E4M3), 35136);
}

TEST(PlanCli, KimiSideBySideJson) {
  CliRun r = run_plan("--model-path " + kConfigs +
                      "kimi-k2.5 --gpu-memory-gib 95.59 --tp-size 8 --page-size 1 "
                      "--mem-fraction-static 0.85 0.88 0.90 --kv-cache-dtype bf16 fp8_e4m3 --json");
  ASSERT_EQ(r.rc, 0) << r.out;
  auto j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_TRUE(j.is_array()) << r.out;
  ASSERT_EQ(j.size(), 6u);
  // Order: fractions outer, dtypes inner. SGLang reported 116K, 159K (bf16) and 376K (fp8).
  EXPECT_NEAR(j[0]["kv_tokens"].get<double>() / 116e3, 1.0, 0.05);
  EXPECT_NEAR(j[2]["kv_tokens"].get<double>() / 159e3, 1.0, 0.05);
  EXPECT_NEAR(j[5]["kv_tokens"].get<double>() / 376e3, 1.0, 0.05);
  EXPECT_EQ(j[5]["kv_bytes_per_token"].get<int64_t>(), 35136);
  EXPECT_EQ(j[0]["weight_bytes_per_rank"].get<int64_t>(), 76182607872);
  for (const auto& col : j) {
    for (const char* key : {"kv_tokens", "kv_bytes_per_token", "weight_bytes_per_rank",
                            "max_running_requests", "total_params", "active_params"}) {
      EXPECT_TRUE(col.contains(key)) << key;
    }
  }
}

TEST(PlanCli, TableAndVerbose) {
  CliRun r =
      run_plan("--model-path " + kConfigs +
               "llama-3.1-8b --gpu-memory-gib 79.65 --mem-fraction-static 0.8 0.9 --verbose");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("8.03 B total"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("131072"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("runtime reserved"), std::string::npos) << r.out;
}

TEST(PlanCli, BadInputIsOneLineAndNonZero) {
  const std::string llama = "--model-path " + kConfigs + "llama-3.1-8b --gpu-memory-gib 80 ";
  for (const std::string& args :
       {std::string("--model-path /nonexistent --gpu-memory-gib 80"),
        llama + "--kv-cache-dtype fp4", llama + "--mem-fraction-static 1.5",
        llama + "--mem-fraction-static 0", llama + "--no-such-flag", llama + "--tp-size 3"}) {
    CliRun r = run_plan(args);
    EXPECT_NE(r.rc, 0) << args;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << args << "\n" << r.out;
    EXPECT_EQ(r.out.rfind("strata plan: ", 0), 0u) << r.out;
  }
}

}  // namespace
}  // namespace strata
