// TopKOp on the GPU (backend/cuda/topk.cu) against the CPU reference (backend/cpu/topk.cc) on the
// same rows: bf16 logits as a drafter's LM head produces them (many exact ties: the lower index
// must win on both) and f32, -inf entries, vocabularies from 7 to 128,256, k from 1 to 64, rows as
// a view into a larger tensor. The ids must be identical; the log-probabilities agree to float
// rounding (both sum the normalizer in double, in different orders). Also the op's time for a
// drafter's step at batch 64 (256 rows of a 32K draft vocabulary, k 4) beside the download it
// replaces.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/top_k.h"

namespace strata {
namespace {

std::vector<float> make_rows(std::mt19937_64& g, int rows, int64_t vocab) {
  std::vector<float> x(size_t(rows) * size_t(vocab));
  std::normal_distribution<float> d(0, 3);
  for (float& v : x) v = round_to_bf16(d(g));
  for (int r = 0; r < rows; r += 3) x[size_t(r) * size_t(vocab)] = -INFINITY;
  return x;
}

TEST(CudaTopK, EqualsTheCpuReference) {
  auto cpu = make_cpu_backend();
  auto gpu = make_cuda_backend();
  TopKOp* cop = top_k_op(*cpu);
  TopKOp* gop = top_k_op(*gpu);
  ASSERT_NE(cop, nullptr);
  ASSERT_NE(gop, nullptr);
  std::mt19937_64 g(3);
  for (int64_t vocab : {int64_t(7), int64_t(2048), int64_t(32000), int64_t(128256)}) {
    const int rows = 19;
    std::vector<float> x = make_rows(g, rows, vocab);
    for (int k : {1, 4, 8, 64}) {
      if (k > vocab) continue;
      std::vector<int32_t> want(size_t(rows) * k);
      std::vector<float> want_lp(want.size());
      cop->top_k(Tensor::make(x.data(), DType::kF32, {rows, vocab}), k, want.data(),
                 want_lp.data());
      for (DType dtype : {DType::kBF16, DType::kF32}) {
        // Rows 2.. of a larger tensor.
        std::vector<float> padded(size_t(rows + 4) * size_t(vocab), 50.0f);
        std::copy(x.begin(), x.end(), padded.begin() + 2 * vocab);
        auto t = gpu->upload(Tensor::make(padded.data(), DType::kF32, {rows + 4, vocab}), dtype);
        std::vector<int32_t> got(want.size()), got_only(want.size());
        std::vector<float> got_lp(want.size());
        gop->top_k(t->view().slice_rows(2, 2 + rows), k, got.data(), got_lp.data());
        gop->top_k(t->view().slice_rows(2, 2 + rows), k, got_only.data(), nullptr);
        SCOPED_TRACE(testing::Message()
                     << "vocab " << vocab << " k " << k << " " << dtype_name(dtype));
        EXPECT_EQ(got, want);
        EXPECT_EQ(got_only, want);
        for (size_t i = 0; i < want.size(); ++i)
          EXPECT_NEAR(got_lp[i], want_lp[i], 2e-6 * std::fabs(want_lp[i]) + 1e-6) << i;
      }
    }
  }
}

TEST(CudaTopK, DrafterStepTimeAgainstTheDownload) {
  auto gpu = make_cuda_backend();
  TopKOp* op = top_k_op(*gpu);
  std::mt19937_64 g(4);
  const int rows = 256, k = 4;
  const int64_t vocab = 32000;
  std::vector<float> x = make_rows(g, rows, vocab);
  auto t = gpu->upload(Tensor::make(x.data(), DType::kF32, {rows, vocab}), DType::kBF16);
  std::vector<int32_t> ids(size_t(rows) * k);
  std::vector<float> lps(ids.size()), host(x.size());
  auto time = [](auto fn) {
    fn();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 20; ++i) fn();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
               .count() /
           20;
  };
  const double op_ms = time([&] { op->top_k(t->view(), k, ids.data(), lps.data()); });
  const double download_ms = time([&] { gpu->download_f32(t->view(), host.data()); });
  const double host_ms = time([&] {
    for (int r = 0; r < rows; ++r)
      top_k_row_reference(host.data() + size_t(r) * vocab, vocab, k, ids.data(), lps.data());
  });
  std::printf(
      "top-k of %d rows x %lld (bf16), k %d: device op %.3f ms; download %.3f ms + host "
      "ranking %.3f ms\n",
      rows, (long long)vocab, k, op_ms, download_ms, host_ms);
}

}  // namespace
}  // namespace strata
