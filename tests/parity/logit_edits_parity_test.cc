// Logit edits on the GPU (backend/cuda/sampling.cu edit_logits: the penalties and logit_bias of
// engine/logit_edits.h) against the CPU twin (edit_logit_reference): on bf16 logits every edited
// value must equal the reference's float32 result rounded to bf16, on float32 logits the
// reference's value, and every other logit must be untouched. Also: house-llama's forward_sample on
// CUDA with edits equals forward + the reference edits + the reference sampler, with the logprob
// rows the model's own (before the edits).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "arch/model.h"
#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "engine/logit_edits.h"
#include "support/forward_sample_edits.h"

namespace strata {
namespace {

bool same(float a, float b) { return a == b || (std::isnan(a) && std::isnan(b)); }

// Random edits, each row naming distinct tokens; some rows none.
std::vector<LogitEdit> random_edits(std::mt19937_64& g, int rows, int64_t vocab) {
  std::vector<LogitEdit> edits;
  for (int r = 0; r < rows; ++r) {
    const int n = r % 4 == 0 ? 0 : int(g() % uint64_t(std::min<int64_t>(vocab, 300))) + 1;
    std::set<int32_t> tokens;
    while (int(tokens.size()) < n) tokens.insert(int32_t(g() % uint64_t(vocab)));
    for (int32_t t : tokens) {
      LogitEdit e{.row = r, .token = t};
      switch (g() % 4) {
        case 0:
          e.bias = std::uniform_real_distribution<float>(-100, 100)(g);
          break;  // logit_bias only
        case 1:
          e.scale = std::uniform_real_distribution<float>(0.2f, 2.0f)(g);
          break;  // repetition only
        default:
          e.subtract = std::uniform_real_distribution<float>(-2.0f, 6.0f)(g);
          e.scale = std::uniform_real_distribution<float>(0.2f, 2.0f)(g);
          e.bias = std::uniform_real_distribution<float>(-5, 5)(g);
      }
      edits.push_back(e);
    }
  }
  std::shuffle(edits.begin(), edits.end(), g);  // the order of edits must not matter
  return edits;
}

TEST(CudaLogitEdits, EqualTheReferenceOnBf16AndFloat32Logits) {
  auto gpu = make_cuda_backend();
  std::mt19937_64 g(17);
  for (int64_t vocab : {int64_t(128256), int64_t(4097), int64_t(5)}) {
    const int rows = 37;
    std::vector<float> logits(size_t(rows) * size_t(vocab));
    for (float& v : logits) v = round_to_bf16(std::normal_distribution<float>(0, 4)(g));
    logits[3] = NAN, logits[size_t(vocab)] = -INFINITY, logits[size_t(vocab) + 1] = INFINITY;
    std::vector<LogitEdit> edits = random_edits(g, rows, vocab);
    if (vocab > 2)
      edits.push_back(
          LogitEdit{.row = 1, .token = vocab > 5 ? int32_t(vocab - 1) : 2, .scale = 1.5f});
    for (DType dtype : {DType::kBF16, DType::kF32}) {
      Tensor host = Tensor::make(logits.data(), DType::kF32, {rows, vocab});
      auto dev = gpu->upload(host, dtype);
      gpu->edit_logits(*dev, edits.data(), int64_t(edits.size()));
      std::vector<float> got(logits.size());
      gpu->download_f32(*dev, got.data());
      std::vector<float> want = logits;
      for (const LogitEdit& e : edits) {
        float& x = want[size_t(e.row) * size_t(vocab) + size_t(e.token)];
        x = edit_logit_reference(x, e);
        if (dtype == DType::kBF16) x = round_to_bf16(x);
      }
      int64_t wrong = 0;
      for (size_t i = 0; i < want.size(); ++i)
        if (!same(got[i], want[i]) && ++wrong <= 5)
          ADD_FAILURE() << dtype_name(dtype) << " vocab " << vocab << " element " << i << ": got "
                        << got[i] << ", want " << want[i] << " (from " << logits[i] << ")";
      EXPECT_EQ(wrong, 0);
      std::printf("edit_logits %s vocab %lld: %zu edits, %lld wrong\n", dtype_name(dtype),
                  (long long)vocab, edits.size(), (long long)wrong);
    }
  }
}

// house-llama: forward_sample with edits on CUDA equals forward, the reference edits (bf16
// rounded, as the device stores them) and the reference sampler on the same device logits.
TEST(CudaLogitEdits, HouseLlamaForwardSampleAppliesEdits) {
  auto gpu = make_cuda_backend();
  auto m = load_model(std::string(STRATA_SHARED_DIR) + "/models/house-llama", *gpu);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  const testing::ForwardSampleEditsCounts c = testing::check_forward_sample_edits(
      **m, DType::kBF16, /*n=*/48, /*page=*/16, /*seed=*/5, /*keep=*/{1, 4, 47},
      /*edits_in_bf16=*/true);
  std::printf(
      "edit_logits house-llama forward_sample: %d of %d rows equal the reference, %d changed by "
      "the edits\n",
      c.equal, c.rows, c.changed);
}

}  // namespace
}  // namespace strata
