// Backend::logit_stats on the CPU reference against a direct float64 computation of the same
// quantities (log-softmax of both rows in long double, KL summed term by term), on rows that
// differ by bf16-sized noise (KLs of 1e-6 and below, where a formula of two large log-sum-exps
// would lose everything), by large changes, with ties for the argmax and -inf logits.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "core/dtype.h"

namespace strata {
namespace {

struct Direct {
  long double kl = 0, dp = 0, nll_ref = 0, nll_cand = 0;
  bool agree = false;
};

Direct direct(const float* r, const float* c, int64_t vocab, int32_t target) {
  auto lse = [&](const float* x) {
    long double m = -INFINITY;
    for (int64_t i = 0; i < vocab; ++i) m = std::max<long double>(m, x[i]);
    long double s = 0;
    for (int64_t i = 0; i < vocab; ++i) s += std::exp((long double)x[i] - m);
    return m + std::log(s);
  };
  const long double lr = lse(r), lc = lse(c);
  Direct d;
  for (int64_t i = 0; i < vocab; ++i) {
    const long double a = (long double)r[i] - lr, b = (long double)c[i] - lc;
    if (std::isinf(a)) continue;
    d.kl += std::exp(a) * (a - b);
  }
  d.nll_ref = lr - r[target];
  d.nll_cand = lc - c[target];
  d.dp = std::exp(-d.nll_cand) - std::exp(-d.nll_ref);
  int64_t br = 0, bc = 0;
  for (int64_t i = 1; i < vocab; ++i) {
    if (r[i] > r[br]) br = i;
    if (c[i] > c[bc]) bc = i;
  }
  d.agree = br == bc;
  return d;
}

TEST(LogitStats, CpuOpEqualsFloat64Reference) {
  auto be = make_cpu_backend();
  std::mt19937_64 g(7);
  for (int64_t vocab : {int64_t(8192), int64_t(3), int64_t(50000)}) {
    const int rows = 24;
    std::vector<float> ref(static_cast<size_t>(rows * vocab)), cand(ref.size());
    std::vector<int32_t> targets(static_cast<size_t>(rows));
    for (int r = 0; r < rows; ++r) {
      // Rows of several kinds: tiny (bf16 rounding) noise, moderate, large changes, a -inf.
      const float noise = r % 3 == 0 ? 0.004f : r % 3 == 1 ? 0.1f : 2.0f;
      for (int64_t i = 0; i < vocab; ++i) {
        const float x = std::normal_distribution<float>(0, 3)(g);
        ref[size_t(r * vocab + i)] = round_to_bf16(x);
        cand[size_t(r * vocab + i)] =
            round_to_bf16(x + std::normal_distribution<float>(0, noise)(g));
      }
      targets[size_t(r)] = int32_t(g() % uint64_t(vocab));
    }
    cand[1] = cand[0];  // a tie for the top in some row is harmless: first index wins
    ref[size_t(vocab) + 1] = -INFINITY;  // a masked logit in the reference
    for (int r = 20; r < rows; ++r)      // identical rows: exactly zero
      std::copy(ref.begin() + r * vocab, ref.begin() + (r + 1) * vocab, cand.begin() + r * vocab);
    std::vector<LogitStatsRow> out(static_cast<size_t>(rows));
    be->logit_stats(Tensor::make(ref.data(), DType::kF32, {rows, vocab}),
                    Tensor::make(cand.data(), DType::kF32, {rows, vocab}), targets.data(),
                    out.data());
    for (int r = 0; r < rows; ++r) {
      const Direct d =
          direct(&ref[size_t(r * vocab)], &cand[size_t(r * vocab)], vocab, targets[size_t(r)]);
      const LogitStatsRow& o = out[size_t(r)];
      SCOPED_TRACE(testing::Message()
                   << "vocab " << vocab << " row " << r << " kl " << double(d.kl));
      EXPECT_NEAR(o.kl, double(d.kl), 2e-6 * double(d.kl) + 1e-12);
      EXPECT_EQ(o.top1_agree, d.agree ? 1.0f : 0.0f);
      if (std::isinf(double(d.nll_ref))) {  // the target is the masked token
        EXPECT_TRUE(std::isinf(o.nll_ref));
      } else {
        EXPECT_NEAR(o.nll_ref, double(d.nll_ref), 1e-6 * std::fabs(double(d.nll_ref)) + 1e-9);
      }
      EXPECT_NEAR(o.nll_cand, double(d.nll_cand), 1e-6 * std::fabs(double(d.nll_cand)) + 1e-9);
      EXPECT_NEAR(o.dp, double(d.dp), 1e-6 * std::fabs(double(d.dp)) + 1e-12);
      if (r >= 20) {
        EXPECT_EQ(o.kl, 0.0f);
        EXPECT_EQ(o.dp, 0.0f);
        EXPECT_EQ(o.nll_ref, o.nll_cand);
      }
    }
    // The reference function is the op, row by row.
    const LogitStatsRow one = logit_stats_reference(&ref[0], &cand[0], vocab, targets[0]);
    EXPECT_EQ(one.kl, out[0].kl);
    EXPECT_EQ(one.nll_cand, out[0].nll_cand);
  }
}

TEST(LogitStats, SmallKlSurvives) {
  // Two rows that differ in one logit by 2^-7 (one bf16 step near 1): the KL is ~1e-9 nats.
  auto be = make_cpu_backend();
  const int64_t vocab = 128256;
  std::vector<float> ref(static_cast<size_t>(vocab), 0.0f), cand(ref.size(), 0.0f);
  ref[5] = 1.0f, cand[5] = 1.0f + 1.0f / 128;
  const int32_t target = 5;
  LogitStatsRow o;
  be->logit_stats(Tensor::make(ref.data(), DType::kF32, {1, vocab}),
                  Tensor::make(cand.data(), DType::kF32, {1, vocab}), &target, &o);
  const Direct d = direct(ref.data(), cand.data(), vocab, target);
  ASSERT_GT(double(d.kl), 0.0);
  EXPECT_LT(double(d.kl), 1e-8);
  EXPECT_NEAR(o.kl, double(d.kl), 1e-6 * double(d.kl));
}

}  // namespace
}  // namespace strata
