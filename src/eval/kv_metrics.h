// KV quality metrics: a candidate KV configuration's logits against the reference's at the same
// positions of the same token stream (teacher forcing). Everything is float32 logits over the
// full vocabulary, reduced in double.
//
// Per position (predicting `target`, the next token of the stream):
//   kl      = Σ_v p_ref(v) · (ln p_ref(v) − ln p_cand(v))          (nats)
//   top1    = argmax p_ref == argmax p_cand
//   dp      = p_cand(target) − p_ref(target)
//   nll_ref = −ln p_ref(target), nll_cand likewise; ln(PPL_cand / PPL_ref) = mean(nll_cand −
//   nll_ref)
// Standard errors are of the mean over positions treated as independent samples (positions of
// one sequence are correlated, so they understate the uncertainty somewhat; bucketed and
// per-sequence numbers in the record let a reader judge).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <vector>

namespace strata {

struct PositionScore {
  double kl = 0;
  bool top1_agree = true;
  double dp = 0;
  double nll_ref = 0;
  double nll_cand = 0;
};

// The reference side of a position, computed once and compared with every candidate.
struct RefDistribution {
  std::vector<double> log_probs;  // [vocab]
  int32_t argmax = 0;
};
RefDistribution make_ref_distribution(const float* logits, int64_t vocab);
// Scores `cand_logits` [vocab] against the reference at a position whose next token is `target`.
PositionScore score_position(const RefDistribution& ref, const float* cand_logits, int32_t target);

// Mean, standard error and quantiles (nearest-rank on the sorted values) of a sample.
struct SampleStats {
  int64_t n = 0;
  double mean = 0, se = 0, rms = 0;
  double p01 = 0, median = 0, p90 = 0, p99 = 0, p999 = 0, max = 0;
};
SampleStats sample_stats(std::vector<double> values);

// Accumulates position scores, with their context positions for the bucketed view. Buckets:
// [0, 64), [64, 128), [128, 256), ... doubling. Not thread-safe.
class KvMetrics {
 public:
  void add(int64_t position, const PositionScore& s);
  int64_t tokens() const { return int64_t(kl_.size()); }
  double mean_kl() const;
  // {"tokens", "kld": {mean, se, median, p90, p99, p99_9, max}, "top1": {agree, se},
  //  "dp": {mean, rms, p01, p99}, "ln_ppl_ratio": {value, se}, "buckets": [...]}
  nlohmann::json to_json() const;
  // Values by position, for plots: [{"begin","end","kld_mean","kld_se"}...] (same as buckets).
  static int bucket_of(int64_t position);
  static int64_t bucket_begin(int bucket);

 private:
  nlohmann::json summary(const std::vector<size_t>& idx) const;
  std::vector<double> kl_, dp_, dnll_, nll_ref_, nll_cand_;
  std::vector<uint8_t> top1_;
  std::vector<int64_t> pos_;
};

}  // namespace strata
