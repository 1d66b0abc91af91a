// Random routed-expert stacks in their stored formats (checkpoint layouts), shared by the MoE
// parity tests: the kernels' (moe_experts_parity_test.cc, moe_gemm_shapes_parity_test.cc, via
// moe_device.h) and the backend ops' (moe_backend_parity_test.cc).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>

#include "backend/backend.h"
#include "core/dtype.h"
#include "core/weight_format.h"

namespace strata::parity {

enum class Fmt { kBf16, kFp8, kInt4g32, kInt4g128 };
inline const char* fmt_name(Fmt f) {
  return f == Fmt::kBf16      ? "bf16"
         : f == Fmt::kFp8     ? "fp8"
         : f == Fmt::kInt4g32 ? "int4 g32"
                              : "int4 g128";
}

// A plain softmax top-k route over `experts` (one group, normalized, no scaling): the MoE
// backend tests' router.
inline MoeRouteArgs softmax_route(int experts, int top_k) {
  return MoeRouteArgs{.num_experts = experts,
                      .top_k = top_k,
                      .num_groups = 1,
                      .topk_groups = 1,
                      .scoring = MoeScoring::kSoftmax,
                      .group_score = MoeGroupScore::kMax,
                      .normalize = true,
                      .scaling_factor = 1.0f};
}

// A random stored weight stack [experts, n, k] in `f` (checkpoint layouts), values scaled so
// that y = x · Wᵀ has unit variance for unit x.
inline HostLinearWeight random_stack(std::mt19937& rng, Fmt f, int64_t experts, int64_t n,
                                     int64_t k) {
  HostLinearWeight w;
  w.stack = experts;
  w.out = n;
  w.in = k;
  const float target = 1.0f / std::sqrt(float(k));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> jitter(0.5f, 1.5f);
  if (f == Fmt::kBf16) {
    w.format = LinearFormat{.format = WeightFormat::kDense, .dense_dtype = DType::kBF16};
    w.values.resize(size_t(experts * n * k * 2));
    for (size_t i = 0; i < w.values.size() / 2; ++i) {
      const uint16_t b = f32_to_bf16(nd(rng) * target);
      std::memcpy(&w.values[2 * i], &b, 2);
    }
  } else if (f == Fmt::kFp8) {
    w.format = LinearFormat{.format = WeightFormat::kFp8Block, .block_out = 128, .block_in = 128};
    w.values.resize(size_t(experts * n * k));
    for (auto& b : w.values) b = f32_to_fp8_e4m3(nd(rng) * 64.0f);  // never NaN (saturates)
    const int64_t sc = (n + 127) / 128 * ((k + 127) / 128);
    w.scales.resize(size_t(experts * sc * 4));
    for (int64_t i = 0; i < experts * sc; ++i) {
      const float v = target / 64.0f * jitter(rng);
      std::memcpy(&w.scales[size_t(4 * i)], &v, 4);
    }
  } else {
    const int group = f == Fmt::kInt4g32 ? 32 : 128;
    w.format = LinearFormat{.format = WeightFormat::kInt4Group, .group_size = group};
    w.values.resize(size_t(experts * n * (k / 8) * 4));
    for (auto& b : w.values) b = uint8_t(rng());
    w.scales.resize(size_t(experts * n * (k / group) * 2));
    for (size_t i = 0; i < w.scales.size() / 2; ++i) {
      const uint16_t b = f32_to_bf16(target / 4.6f * jitter(rng) * (rng() % 8 == 0 ? -1.0f : 1.0f));
      std::memcpy(&w.scales[2 * i], &b, 2);
    }
  }
  w.check_sizes();
  return w;
}

}  // namespace strata::parity
