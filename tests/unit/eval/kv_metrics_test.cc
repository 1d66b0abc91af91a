// KV quality metrics against hand-computed values.
#include "eval/kv_metrics.h"

#include <gtest/gtest.h>

#include <cmath>

namespace strata {
namespace {

TEST(KvMetrics, TwoTokenVocabularyByHand) {
  // p_ref = (1/2, 1/2); p_cand = (3/4, 1/4); next token 1.
  const float ref_logits[2] = {0.0f, 0.0f};
  const float cand_logits[2] = {float(std::log(3.0)), 0.0f};
  const RefDistribution ref = make_ref_distribution(ref_logits, 2);
  const PositionScore s = score_position(ref, cand_logits, 1);
  // KL = 1/2 ln(2/3) + 1/2 ln(2) = 1/2 ln(4/3)
  EXPECT_NEAR(s.kl, 0.5 * std::log(4.0 / 3.0), 1e-7);
  EXPECT_NEAR(s.dp, 0.25 - 0.5, 1e-7);
  EXPECT_NEAR(s.nll_ref, std::log(2.0), 1e-7);
  EXPECT_NEAR(s.nll_cand, std::log(4.0), 1e-7);
  EXPECT_TRUE(s.top1_agree);  // ties go to the first index
}

TEST(KvMetrics, ThreeTokensTop1DisagreesAndIdenticalIsZero) {
  // p_ref = (0.5, 0.3, 0.2) and p_cand = (0.2, 0.5, 0.3), as logits ln p (+ an offset, which
  // softmax ignores).
  const float ref_logits[3] = {float(std::log(0.5) + 7), float(std::log(0.3) + 7),
                               float(std::log(0.2) + 7)};
  const float cand_logits[3] = {float(std::log(0.2)), float(std::log(0.5)), float(std::log(0.3))};
  const RefDistribution ref = make_ref_distribution(ref_logits, 3);
  const PositionScore s = score_position(ref, cand_logits, 2);
  const double kl =
      0.5 * std::log(0.5 / 0.2) + 0.3 * std::log(0.3 / 0.5) + 0.2 * std::log(0.2 / 0.3);
  EXPECT_NEAR(s.kl, kl, 1e-6);
  EXPECT_FALSE(s.top1_agree);
  EXPECT_NEAR(s.dp, 0.1, 1e-6);
  const PositionScore same = score_position(ref, ref_logits, 0);
  EXPECT_EQ(same.kl, 0.0);
  EXPECT_TRUE(same.top1_agree);
  EXPECT_NEAR(same.dp, 0.0, 1e-12);
}

TEST(KvMetrics, SampleStatsByHand) {
  std::vector<double> v;
  for (int i = 1; i <= 1000; ++i) v.push_back(i);
  const SampleStats s = sample_stats(v);
  EXPECT_EQ(s.n, 1000);
  EXPECT_DOUBLE_EQ(s.mean, 500.5);
  // sd of 1..n = sqrt(n(n+1)/12) with the n-1 denominator: sqrt(1000·1001/12) = 288.819...
  EXPECT_NEAR(s.se, std::sqrt(1000.0 * 1001.0 / 12.0) / std::sqrt(1000.0), 1e-9);
  EXPECT_DOUBLE_EQ(s.median, 500);
  EXPECT_DOUBLE_EQ(s.p90, 900);
  EXPECT_DOUBLE_EQ(s.p99, 990);
  EXPECT_DOUBLE_EQ(s.p999, 999);
  EXPECT_DOUBLE_EQ(s.p01, 10);
  EXPECT_DOUBLE_EQ(s.max, 1000);
  EXPECT_NEAR(s.rms, std::sqrt(1000.0 * 1001.0 * 2001.0 / 6.0 / 1000.0), 1e-9);
}

TEST(KvMetrics, AggregatesAndBuckets) {
  KvMetrics m;
  // Positions 0 and 70: KL 0.1 and 0.3, one top-1 miss, nll deltas +0.2 and -0.1.
  m.add(0, {.kl = 0.1, .top1_agree = true, .dp = -0.05, .nll_ref = 1.0, .nll_cand = 1.2});
  m.add(70, {.kl = 0.3, .top1_agree = false, .dp = 0.05, .nll_ref = 2.0, .nll_cand = 1.9});
  const nlohmann::json j = m.to_json();
  EXPECT_EQ(j["tokens"], 2);
  EXPECT_NEAR(j["kld"]["mean"].get<double>(), 0.2, 1e-12);
  EXPECT_NEAR(j["kld"]["se"].get<double>(), 0.1, 1e-12);  // sd 0.1414 / sqrt 2
  EXPECT_NEAR(j["top1"]["agree"].get<double>(), 0.5, 1e-12);
  EXPECT_NEAR(j["dp"]["rms"].get<double>(), 0.05, 1e-12);
  EXPECT_NEAR(j["ln_ppl_ratio"]["value"].get<double>(), 0.05, 1e-12);
  ASSERT_EQ(j["buckets"].size(), 2u);
  EXPECT_EQ(j["buckets"][0]["begin"], 0);
  EXPECT_EQ(j["buckets"][0]["end"], 64);
  EXPECT_EQ(j["buckets"][1]["begin"], 64);
  EXPECT_EQ(j["buckets"][1]["end"], 128);
  EXPECT_NEAR(j["buckets"][1]["kld"]["mean"].get<double>(), 0.3, 1e-12);
  EXPECT_EQ(KvMetrics::bucket_of(63), 0);
  EXPECT_EQ(KvMetrics::bucket_of(64), 1);
  EXPECT_EQ(KvMetrics::bucket_of(128), 2);
  EXPECT_EQ(KvMetrics::bucket_of(1023), 4);
}

}  // namespace
}  // namespace strata
