// top_k_row_reference and the CPU backend's TopKOp (backend/top_k.h) against a direct ranking:
// every index sorted by (value descending, index ascending), the first k, and log-probabilities
// from a log-softmax computed in long double; ties (bf16-like coarse values), -inf entries, NaNs
// (never taken before a number), k = 1 (the argmax) and k = vocab; rows of a tensor in parallel.
#include "backend/top_k.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

namespace strata {
namespace {

std::vector<float> random_row(std::mt19937& g, int64_t vocab, bool coarse) {
  std::vector<float> row(static_cast<size_t>(vocab));
  std::normal_distribution<float> d(0, 3);
  // Coarse values: many exact ties, as bf16 logits have.
  for (float& x : row) x = coarse ? std::round(d(g) * 2) / 2 : d(g);
  return row;
}

void expect_direct(const std::vector<float>& row, int k, const int32_t* ids, const float* lps) {
  std::vector<int32_t> order(row.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    const float x = row[size_t(a)], y = row[size_t(b)];
    if (std::isnan(x) || std::isnan(y)) return !std::isnan(x) && std::isnan(y);
    return x > y;
  });
  long double max = -INFINITY, sum = 0;
  for (float x : row)
    if (!std::isnan(x)) max = std::max<long double>(max, x);
  for (float x : row) sum += std::exp((long double)x - max);
  for (int j = 0; j < k; ++j) {
    ASSERT_EQ(ids[j], order[size_t(j)]) << "rank " << j;
    if (lps != nullptr) {
      const long double want = row[size_t(order[size_t(j)])] - max - std::log(sum);
      EXPECT_NEAR(lps[j], double(want), 1e-5 * std::fabs(double(want)) + 1e-6) << "rank " << j;
    }
  }
}

TEST(TopK, ReferenceEqualsADirectRanking) {
  std::mt19937 g(5);
  for (int64_t vocab : {int64_t(1), int64_t(7), int64_t(2048), int64_t(32000)}) {
    for (bool coarse : {false, true}) {
      std::vector<float> row = random_row(g, vocab, coarse);
      if (vocab > 10) {
        row[3] = -INFINITY;
        row[5] = row[9];  // a tie for sure
      }
      for (int k : {1, 4, 8, 64}) {
        if (k > vocab) continue;
        SCOPED_TRACE(testing::Message() << "vocab " << vocab << " coarse " << coarse << " k " << k);
        std::vector<int32_t> ids(static_cast<size_t>(k));
        std::vector<float> lps(static_cast<size_t>(k));
        top_k_row_reference(row.data(), vocab, k, ids.data(), lps.data());
        expect_direct(row, k, ids.data(), lps.data());
        if (k == 1) EXPECT_EQ(ids[0], argmax_row_reference(row.data(), vocab));
      }
    }
  }
}

TEST(TopK, AllOfASmallRowAndNaNsLast) {
  const std::vector<float> row = {1.0f, NAN, 3.0f, 3.0f, -INFINITY, 0.5f};
  std::vector<int32_t> ids(6);
  top_k_row_reference(row.data(), 6, 5, ids.data(), nullptr);
  EXPECT_EQ(std::vector<int32_t>(ids.begin(), ids.begin() + 5),
            (std::vector<int32_t>{2, 3, 0, 5, 4}));
}

TEST(TopK, CpuBackendRowsEqualTheReference) {
  auto be = make_cpu_backend();
  TopKOp* op = top_k_op(*be);
  ASSERT_NE(op, nullptr);
  std::mt19937 g(9);
  const int rows = 37, k = 8;
  const int64_t vocab = 2048;
  std::vector<float> all;
  for (int r = 0; r < rows; ++r) {
    const std::vector<float> row = random_row(g, vocab, r % 2 == 0);
    all.insert(all.end(), row.begin(), row.end());
  }
  auto logits = be->upload(Tensor::make(all.data(), DType::kF32, {rows, vocab}), DType::kF32);
  std::vector<int32_t> ids(size_t(rows) * k), ids_only(ids.size());
  std::vector<float> lps(ids.size());
  // Rows 3.. of the tensor (a view), with and without log-probabilities.
  op->top_k(logits->view().slice_rows(3, rows), k, ids.data(), lps.data());
  op->top_k(logits->view().slice_rows(3, rows), k, ids_only.data(), nullptr);
  for (int r = 3; r < rows; ++r) {
    std::vector<int32_t> want(k);
    std::vector<float> want_lp(k);
    top_k_row_reference(all.data() + r * vocab, vocab, k, want.data(), want_lp.data());
    for (int j = 0; j < k; ++j) {
      const size_t at = size_t(r - 3) * k + size_t(j);
      EXPECT_EQ(ids[at], want[size_t(j)]) << r;
      EXPECT_EQ(ids_only[at], want[size_t(j)]) << r;
      EXPECT_EQ(lps[at], want_lp[size_t(j)]) << r;  // the same code: bit for bit
    }
  }
}

TEST(TopKDeathTest, RefusesKOutOfRange) {
  const std::vector<float> row(4, 0.0f);
  int32_t ids[8];
  EXPECT_DEATH(top_k_row_reference(row.data(), 4, 5, ids, nullptr), "k 5 for a vocabulary of 4");
  EXPECT_DEATH(top_k_row_reference(row.data(), 4, 0, ids, nullptr), "k 0");
}

}  // namespace
}  // namespace strata
