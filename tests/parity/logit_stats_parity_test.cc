// Backend::logit_stats on the GPU (backend/cuda/logit_stats.cu) against the CPU op
// (backend/cpu/logit_stats.cc) on the same rows: bf16 logits as the models produce them and f32,
// rows that differ by bf16-rounding noise (KLs near 1e-7), by moderate and by large changes, ties
// for the top, a -inf logit, identical rows (exactly 0), and rows that are views into a larger
// tensor (eval-kv's stored reference). Both sum in double in different orders: agreement to float
// rounding. Also the op's speed on the 8B Llama vocabulary (128,256).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"

namespace strata {
namespace {

struct Rows {
  std::vector<float> ref, cand;
  std::vector<int32_t> targets;
};

Rows make_rows(std::mt19937_64& g, int rows, int64_t vocab) {
  Rows r;
  r.ref.resize(size_t(rows) * size_t(vocab));
  r.cand.resize(r.ref.size());
  for (int i = 0; i < rows; ++i) {
    const float noise = i % 4 == 0 ? 0.0f : i % 4 == 1 ? 0.01f : i % 4 == 2 ? 0.2f : 3.0f;
    for (int64_t v = 0; v < vocab; ++v) {
      const float x = std::normal_distribution<float>(0, 3)(g);
      r.ref[size_t(i * vocab + v)] = round_to_bf16(x);
      r.cand[size_t(i * vocab + v)] =
          round_to_bf16(x + (noise > 0 ? std::normal_distribution<float>(0, noise)(g) : 0));
    }
    r.targets.push_back(int32_t(g() % uint64_t(vocab)));
  }
  r.cand[1] = r.cand[0];                 // a tie
  r.ref[size_t(vocab) + 2] = -INFINITY;  // masked in the reference
  if (r.targets[1] == 2)
    r.targets[1] = 0;  // a masked target's NLL is inf on both: not compared here
  return r;
}

TEST(CudaLogitStats, EqualsTheCpuOp) {
  auto cpu = make_cpu_backend();
  auto gpu = make_cuda_backend();
  std::mt19937_64 g(11);
  for (int64_t vocab : {int64_t(128256), int64_t(8192), int64_t(129280), int64_t(7)}) {
    const int rows = 33;
    Rows r = make_rows(g, rows, vocab);
    std::vector<LogitStatsRow> want(static_cast<size_t>(rows));
    cpu->logit_stats(Tensor::make(r.ref.data(), DType::kF32, {rows, vocab}),
                     Tensor::make(r.cand.data(), DType::kF32, {rows, vocab}), r.targets.data(),
                     want.data());
    for (DType dtype : {DType::kBF16, DType::kF32}) {
      // The reference as rows 5.. of a larger tensor, as eval-kv stores it.
      std::vector<float> padded(size_t(rows + 9) * size_t(vocab), 100.0f);
      std::copy(r.ref.begin(), r.ref.end(), padded.begin() + 5 * vocab);
      auto ref = gpu->upload(Tensor::make(padded.data(), DType::kF32, {rows + 9, vocab}), dtype);
      auto cand = gpu->upload(Tensor::make(r.cand.data(), DType::kF32, {rows, vocab}), dtype);
      std::vector<LogitStatsRow> got(static_cast<size_t>(rows));
      gpu->logit_stats(ref->view().slice_rows(5, 5 + rows), *cand, r.targets.data(), got.data());
      for (int i = 0; i < rows; ++i) {
        const LogitStatsRow &w = want[size_t(i)], &o = got[size_t(i)];
        SCOPED_TRACE(testing::Message() << "vocab " << vocab << " " << dtype_name(dtype) << " row "
                                        << i << " kl " << w.kl);
        EXPECT_NEAR(o.kl, w.kl, 1e-5 * w.kl + 1e-12);
        EXPECT_EQ(o.top1_agree, w.top1_agree);
        EXPECT_NEAR(o.dp, w.dp, 1e-5 * std::fabs(w.dp) + 1e-12);
        EXPECT_NEAR(o.nll_ref, w.nll_ref, 1e-6 * std::fabs(w.nll_ref) + 1e-9);
        EXPECT_NEAR(o.nll_cand, w.nll_cand, 1e-6 * std::fabs(w.nll_cand) + 1e-9);
        if (i % 4 == 0 && i != 0) {
          EXPECT_EQ(o.kl, 0.0f);  // identical rows
        }
      }
    }
  }
}

TEST(CudaLogitStats, SpeedOnTheLlama8BVocabulary) {
  auto gpu = make_cuda_backend();
  const int rows = 4096;
  const int64_t vocab = 128256;
  std::mt19937_64 g(3);
  std::vector<float> host(size_t(rows) * size_t(vocab));
  for (float& x : host) x = round_to_bf16(std::normal_distribution<float>(0, 3)(g));
  auto ref = gpu->upload(Tensor::make(host.data(), DType::kF32, {rows, vocab}), DType::kBF16);
  for (float& x : host) x = round_to_bf16(x + 0.05f);
  auto cand = gpu->upload(Tensor::make(host.data(), DType::kF32, {rows, vocab}), DType::kBF16);
  std::vector<int32_t> targets(size_t(rows), 17);
  std::vector<LogitStatsRow> out(static_cast<size_t>(rows));
  gpu->logit_stats(*ref, *cand, targets.data(), out.data());  // warm-up
  const auto t0 = std::chrono::steady_clock::now();
  const int reps = 5;
  for (int i = 0; i < reps; ++i) gpu->logit_stats(*ref, *cand, targets.data(), out.data());
  const double s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
  std::printf(
      "logit_stats: %d rows x %lld bf16: %.2f ms (%.0f rows/s, %.0f GB/s of logits read twice)\n",
      rows, (long long)vocab, 1e3 * s, rows / s, 4.0 * rows * double(vocab) / s / 1e9);
  EXPECT_LT(s, 0.5);  // far below a forward pass of these rows
}

}  // namespace
}  // namespace strata
