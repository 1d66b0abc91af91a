#include "arch/rope.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"

namespace strata {
namespace {

// base^(-2i/dim) for i in [0, dim/2), rounded the way torch computes it in float32.
std::vector<float> default_inv_freq(double base, int dim) {
  std::vector<float> inv(static_cast<size_t>(dim / 2));
  for (int i = 0; i < dim / 2; ++i) {
    const float exponent = float(2 * i) / float(dim);
    inv[size_t(i)] = 1.0f / std::pow(float(base), exponent);
  }
  return inv;
}

void apply_llama3(const RopeSpec& r, std::vector<float>& inv) {
  const double old_ctx = double(r.original_max_position_embeddings);
  const double low_wavelen = old_ctx / r.low_freq_factor;
  const double high_wavelen = old_ctx / r.high_freq_factor;
  for (float& f : inv) {
    const double wavelen = 2 * M_PI / f;
    if (wavelen < high_wavelen) continue;  // high frequency: unchanged
    if (wavelen > low_wavelen) {
      f = float(f / r.factor);
      continue;
    }
    const double smooth =
        (old_ctx / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
    f = float((1 - smooth) * f / r.factor + smooth * f);
  }
}

RopeFrequencies yarn(const RopeSpec& r, int64_t max_pos) {
  const int dim = r.rotary_dim;
  const double base = r.theta;
  double factor = r.factor;
  const int64_t orig =
      r.original_max_position_embeddings > 0 ? r.original_max_position_embeddings : max_pos;
  RopeFrequencies out;
  if (r.attention_factor) {
    out.attention_factor = float(*r.attention_factor);
  } else if (r.mscale != 0 && r.mscale_all_dim != 0) {
    out.attention_factor =
        float(yarn_get_mscale(factor, r.mscale) / yarn_get_mscale(factor, r.mscale_all_dim));
  } else {
    out.attention_factor = float(yarn_get_mscale(factor, 1.0));
  }
  auto correction_dim = [&](double rotations) {
    return (dim * std::log(double(orig) / (rotations * 2 * M_PI))) / (2 * std::log(base));
  };
  double low = correction_dim(r.beta_fast), high = correction_dim(r.beta_slow);
  if (r.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, double(dim - 1));
  if (low == high) high += 0.001;
  out.inv_freq.resize(size_t(dim / 2));
  for (int i = 0; i < dim / 2; ++i) {
    const float pos_freq = std::pow(float(base), float(2 * i) / float(dim));
    const float extrapolation = 1.0f / pos_freq;
    const float interpolation = 1.0f / (float(factor) * pos_freq);
    const float ramp = std::clamp(float((i - low) / (high - low)), 0.0f, 1.0f);
    const float extrapolation_factor = 1.0f - ramp;
    out.inv_freq[size_t(i)] =
        interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor;
  }
  return out;
}

}  // namespace

double yarn_get_mscale(double scale, double mscale) {
  if (scale <= 1) return 1.0;
  return 0.1 * mscale * std::log(scale) + 1.0;
}

RopeFrequencies compute_rope_frequencies(const RopeSpec& rope, int64_t max_pos) {
  CHECK_GT(rope.rotary_dim, 0);
  RopeFrequencies out;
  switch (rope.type) {
    case RopeType::kDefault:
    case RopeType::kDynamic:  // same as default until the sequence outgrows the context
      out.inv_freq = default_inv_freq(rope.theta, rope.rotary_dim);
      break;
    case RopeType::kLinear:
      out.inv_freq = default_inv_freq(rope.theta, rope.rotary_dim);
      for (float& f : out.inv_freq) f = float(f / rope.factor);
      break;
    case RopeType::kLlama3:
      out.inv_freq = default_inv_freq(rope.theta, rope.rotary_dim);
      apply_llama3(rope, out.inv_freq);
      break;
    case RopeType::kYarn:
      return yarn(rope, max_pos);
  }
  return out;
}

RopeFrequencies dynamic_rope_frequencies(const RopeSpec& rope, int64_t max_pos, int64_t seq_len) {
  const int64_t orig =
      rope.original_max_position_embeddings > 0 ? rope.original_max_position_embeddings : max_pos;
  if (rope.type != RopeType::kDynamic || seq_len <= orig)
    return compute_rope_frequencies(rope, max_pos);
  const int dim = rope.rotary_dim;
  const double base =
      rope.theta * std::pow(rope.factor * double(seq_len) / double(orig) - (rope.factor - 1),
                            double(dim) / double(dim - 2));
  RopeFrequencies out;
  out.inv_freq = default_inv_freq(base, dim);
  return out;
}

}  // namespace strata
