// The EAGLE-3 drafter on the CUDA backend (bf16 weights, activations and KV) against
// tools/eagle3_train.py's float32 PyTorch forward (tests/fixtures/eagle3/house-llama's
// reference.safetensors): a prefill step and a draft step fed its own hidden state.
//
// Bounds (bf16 end to end through one decoder layer): logits NMSE < 1e-3, argmax agreement >= 90%
// of the rows (near-ties may flip), hidden states rel max error < 5e-2. The CPU backend meets the
// float32 bounds of tests/golden/eagle3.
#include <gtest/gtest.h>

#include "backend/cuda/cuda_backend.h"
#include "support/eagle3_check.h"

namespace strata::testing {
namespace {

TEST(CudaEagle3, MatchesPyTorchReference) {
  const std::string drafter = STRATA_REPO_FIXTURES_DIR "/eagle3/house-llama";
  auto backend = make_cuda_backend();
  auto d = Eagle3Drafter::load(drafter, *backend, nullptr, shared_dir() + "/models/house-llama");
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  const Eagle3Errors e =
      check_eagle3_reference(**d, drafter + "/reference.safetensors", {0, 3, 7, 12}, DType::kBF16);
  std::printf(
      "eagle3 cuda: step 1 hidden %.3g nmse %.3g argmax %.3f; step 2 hidden %.3g nmse "
      "%.3g argmax %.3f\n",
      e.step1_hidden, e.step1_nmse, e.step1_argmax, e.step2_hidden, e.step2_nmse, e.step2_argmax);
  EXPECT_LT(e.step1_nmse, 1e-3);
  EXPECT_LT(e.step2_nmse, 1e-3);
  EXPECT_GE(e.step1_argmax, 0.9);
  EXPECT_GE(e.step2_argmax, 0.75);  // 4 rows: one near-tie flip allowed
  EXPECT_LT(e.step1_hidden, 5e-2);
  EXPECT_LT(e.step2_hidden, 5e-2);
}

}  // namespace
}  // namespace strata::testing
