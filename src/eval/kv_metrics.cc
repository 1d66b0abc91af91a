#include "eval/kv_metrics.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/check.h"

namespace strata {
namespace {

// ln Σ exp(x) in double, stable.
double log_sum_exp(const float* x, int64_t n, int32_t* argmax) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  if (argmax) *argmax = int32_t(best);
  const double m = x[best];
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(double(x[i]) - m);
  return m + std::log(sum);
}

double quantile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  const size_t rank = size_t(std::ceil(q * double(sorted.size())));
  return sorted[std::min(sorted.size() - 1, rank == 0 ? 0 : rank - 1)];
}

}  // namespace

RefDistribution make_ref_distribution(const float* logits, int64_t vocab) {
  RefDistribution r;
  const double lse = log_sum_exp(logits, vocab, &r.argmax);
  r.log_probs.resize(size_t(vocab));
  for (int64_t i = 0; i < vocab; ++i) r.log_probs[size_t(i)] = double(logits[i]) - lse;
  return r;
}

PositionScore score_position(const RefDistribution& ref, const float* cand, int32_t target) {
  const int64_t vocab = int64_t(ref.log_probs.size());
  CHECK(target >= 0 && target < vocab);
  int32_t cand_argmax = 0;
  const double lse = log_sum_exp(cand, vocab, &cand_argmax);
  double kl = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    const double lr = ref.log_probs[size_t(i)];
    kl += std::exp(lr) * (lr - (double(cand[i]) - lse));
  }
  PositionScore s;
  s.kl = std::max(0.0, kl);  // rounding can leave -1e-17 where the distributions agree
  s.top1_agree = cand_argmax == ref.argmax;
  s.nll_ref = -ref.log_probs[size_t(target)];
  s.nll_cand = -(double(cand[target]) - lse);
  s.dp = std::exp(-s.nll_cand) - std::exp(-s.nll_ref);
  return s;
}

SampleStats sample_stats(std::vector<double> v) {
  SampleStats s;
  s.n = int64_t(v.size());
  if (v.empty()) return s;
  const double n = double(v.size());
  double sum = 0, sq = 0;
  for (double x : v) sum += x, sq += x * x;
  s.mean = sum / n;
  s.rms = std::sqrt(sq / n);
  if (v.size() > 1) {
    double var = 0;
    for (double x : v) var += (x - s.mean) * (x - s.mean);
    s.se = std::sqrt(var / (n - 1) / n);
  }
  std::sort(v.begin(), v.end());
  s.p01 = quantile(v, 0.01);
  s.median = quantile(v, 0.5);
  s.p90 = quantile(v, 0.9);
  s.p99 = quantile(v, 0.99);
  s.p999 = quantile(v, 0.999);
  s.max = v.back();
  return s;
}

int KvMetrics::bucket_of(int64_t position) {
  int b = 0;
  for (int64_t end = 64; position >= end; end *= 2) ++b;
  return b;
}

int64_t KvMetrics::bucket_begin(int bucket) { return bucket == 0 ? 0 : int64_t(32) << bucket; }

void KvMetrics::add(int64_t position, const PositionScore& s) {
  kl_.push_back(s.kl);
  dp_.push_back(s.dp);
  nll_ref_.push_back(s.nll_ref);
  nll_cand_.push_back(s.nll_cand);
  dnll_.push_back(s.nll_cand - s.nll_ref);
  top1_.push_back(s.top1_agree ? 1 : 0);
  pos_.push_back(position);
}

double KvMetrics::mean_kl() const {
  return kl_.empty() ? 0 : std::accumulate(kl_.begin(), kl_.end(), 0.0) / double(kl_.size());
}

nlohmann::json KvMetrics::summary(const std::vector<size_t>& idx) const {
  std::vector<double> kl, dp, dnll;
  double agree = 0, nll_r = 0, nll_c = 0;
  for (size_t i : idx) {
    kl.push_back(kl_[i]);
    dp.push_back(dp_[i]);
    dnll.push_back(dnll_[i]);
    agree += top1_[i];
    nll_r += nll_ref_[i];
    nll_c += nll_cand_[i];
  }
  const double n = std::max<double>(1, double(idx.size()));
  const SampleStats k = sample_stats(kl), d = sample_stats(dp), l = sample_stats(dnll);
  const double a = agree / n;
  return {{"tokens", idx.size()},
          {"kld",
           {{"mean", k.mean},
            {"se", k.se},
            {"median", k.median},
            {"p90", k.p90},
            {"p99", k.p99},
            {"p99_9", k.p999},
            {"max", k.max}}},
          {"top1", {{"agree", a}, {"se", std::sqrt(a * (1 - a) / n)}}},
          {"dp", {{"mean", d.mean}, {"se", d.se}, {"rms", d.rms}, {"p01", d.p01}, {"p99", d.p99}}},
          {"ln_ppl_ratio", {{"value", l.mean}, {"se", l.se}}},
          {"ppl_ref", std::exp(nll_r / n)},
          {"ppl_cand", std::exp(nll_c / n)}};
}

nlohmann::json KvMetrics::to_json() const {
  std::vector<size_t> all(kl_.size());
  std::iota(all.begin(), all.end(), 0);
  nlohmann::json j = summary(all);
  std::vector<std::vector<size_t>> buckets;
  for (size_t i = 0; i < pos_.size(); ++i) {
    const size_t b = size_t(bucket_of(pos_[i]));
    if (buckets.size() <= b) buckets.resize(b + 1);
    buckets[b].push_back(i);
  }
  j["buckets"] = nlohmann::json::array();
  for (size_t b = 0; b < buckets.size(); ++b) {
    if (buckets[b].empty()) continue;
    nlohmann::json s = summary(buckets[b]);
    s["begin"] = bucket_begin(int(b));
    s["end"] = bucket_begin(int(b) + 1);
    j["buckets"].push_back(std::move(s));
  }
  return j;
}

}  // namespace strata
