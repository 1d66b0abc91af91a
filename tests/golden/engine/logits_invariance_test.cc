// The CPU reference is batch-invariant (what --enable-deterministic-inference makes the CUDA
// backend; bench/cuda/determinism_check.sh checks that on the GPU with the same schedules): on
// the house models, each sequence's logits rows are bitwise the same alone, in a batch, in
// reverse order on other pages, with prompts in chunks of 16 or 5 beside other sequences'
// decode steps, and with its decode positions computed by one prefill chunk
// (tests/support/logit_schedules.h).
#include <gtest/gtest.h>

#include "backend/backend.h"
#include "dist/tensor_parallel.h"
#include "engine/engine.h"
#include "support/logit_schedules.h"

namespace strata {
namespace {

class LogitsInvariance : public ::testing::TestWithParam<std::string> {};

TEST_P(LogitsInvariance, CpuRowsIndependentOfBatchOrderAndChunking) {
  auto be = make_cpu_backend();
  auto m = load_model(std::string(STRATA_SHARED_DIR) + "/models/" + GetParam(), *be);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  const auto setup = testing::make_invariance_setup(12, (*m)->spec().vocab_size, 3, 70, 5);
  const auto alone = testing::alone_rows(**m, *be, setup);
  ASSERT_EQ(alone.size(), size_t(12 * 5));
  for (const auto& sched : testing::invariance_schedules(setup)) {
    const auto got = testing::run_schedule(**m, *be, setup, sched.steps, sched.page_base);
    const auto d = testing::compare_rows(alone, got);
    EXPECT_EQ(d.rows, 12 * 5) << sched.name;
    EXPECT_EQ(d.differing, 0) << sched.name << ": max |diff| " << d.max_abs;
  }
}

INSTANTIATE_TEST_SUITE_P(HouseModels, LogitsInvariance,
                         ::testing::Values("house-llama", "house-mla"));

// --enable-deterministic-inference with tensor parallelism on cuda: refused before anything loads
// (NCCL's all-reduce order follows the message size), naming the flag; on cpu ranks it runs.
TEST(DeterministicInference, RefusedWithCudaTensorParallelism) {
  EngineConfig c;
  c.model_path = std::string(STRATA_SHARED_DIR) + "/models/house-llama";
  c.deterministic_inference = true;
  c.tp_size = 2;
  c.tp_allow_uneven = true;
  c.device = Device::kCuda;
  auto e = Engine::create(c, &tensor_parallel_runtime());
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("--enable-deterministic-inference with --tp-size 2"),
            std::string::npos)
      << e.status().to_string();
  c.device = Device::kCpu;
  e = Engine::create(c, &tensor_parallel_runtime());
  EXPECT_TRUE(e.ok()) << e.status().to_string();
}

}  // namespace
}  // namespace strata
