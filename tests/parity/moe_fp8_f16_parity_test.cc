// The FP8 experts' decode GEMV against x staged in f16 (backend/cuda/moe_stage_f16.cu,
// MoeExpertsParams::fp8_f16): the staging's exactness, and the layer against the CPU twin when
// rows differ in magnitude by up to 2^60 (the per-row power of two is what keeps f16 exact).
// moe_experts_parity_test.cc runs the same path on the common cases.
//
// References and bounds:
// - staging: from its contract, on the host. Row r's inv is 2^-e with e = 14 - floor(log2 of
//   the row's largest |x|) (clamped to [-126, 126]; 0 for a zero or non-finite row), and each
//   f16 value, read back from its place in the fragment order (MoeStageF16Params), times inv
//   gives x back exactly when |x| >= 2^-31 of the row's largest; smaller ones within half of
//   f16's subnormal step (2^-25 · inv). A wrong exponent, rounding or place breaks exactness on
//   most elements.
// - layer: the CPU twin with the same weights and x, per token row (a row of 2^-30 must be as
//   right as one of 2^30): NMSE bound 4e-5, as moe_experts_parity_test.cc's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/moe_experts.h"
#include "parity/moe_device.h"

namespace strata::parity {
namespace {

double f16_to_double(uint16_t h) {
  const int sign = h >> 15, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  double v;
  if (exp == 0)
    v = std::ldexp(double(mant), -24);
  else if (exp == 31)
    v = mant ? NAN : INFINITY;
  else
    v = std::ldexp(double(mant | 0x400), exp - 25);
  return sign ? -v : v;
}

// The column whose value MoeStageF16Params stores at position p of a row.
int64_t staged_column(int64_t p) {
  const int64_t c = (p % 32) / 8, e = p % 8;
  const int64_t off[8] = {0, 1, 8, 9, 16, 17, 24, 25};
  return p / 32 * 32 + 2 * c + off[e];
}

TEST(MoeFp8F16, StagingIsExact) {
  Stream s;
  std::mt19937 rng(41);
  for (int64_t k : {32, 256, 7168}) {
    // Rows: normal values times 2^r, a zero row, a row with an inf, bf16 subnormals.
    const std::vector<int> shifts = {0, -60, 60, -126, 120, 7, -20};
    const int64_t rows = int64_t(shifts.size()) + 3;
    std::vector<float> x(size_t(rows * k));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < k; ++i) {
        float v = 0.0f;
        if (r < int64_t(shifts.size()))
          v = round_to_bf16(
              std::ldexp(std::normal_distribution<float>(0.0f, 1.0f)(rng), shifts[size_t(r)]));
        else if (r == rows - 2)
          v = i == k / 2 ? INFINITY : 1.0f;
        else if (r == rows - 1)
          v = bf16_to_f32(uint16_t(rng() % 0x7f));  // subnormal bf16 bits (and zero)
        x[size_t(r * k + i)] = v;
      }
    auto dx = upload(to_bits(x), s);
    Dev x16(size_t(rows * k) * 2), inv(size_t(rows) * 4);
    cuda::MoeStageF16Params p{};
    p.x = dx->as<bf16_bits>();
    p.x16 = x16.as<uint16_t>();
    p.inv = inv.as<float>();
    p.rows = rows;
    p.k = k;
    cuda::launch_moe_stage_f16(p, s.get());
    const auto h16 = download<uint16_t>(x16.as<void>(), size_t(rows * k), s);
    const auto hinv = download<float>(inv.as<void>(), size_t(rows), s);
    const std::vector<uint16_t> xb = to_bits(x);
    for (int64_t r = 0; r < rows; ++r) {
      float m = 0.0f;
      bool finite = true;
      for (int64_t i = 0; i < k; ++i) {
        const float v = bf16_to_f32(xb[size_t(r * k + i)]);
        finite = finite && std::isfinite(v);
        m = std::max(m, std::fabs(v));
      }
      const int e = (m == 0.0f || !finite) ? 0 : std::clamp(14 - std::ilogb(m), -126, 126);
      ASSERT_EQ(hinv[size_t(r)], std::ldexp(1.0f, -e)) << "k " << k << " row " << r;
      int64_t bad = 0;
      double top = 0;
      for (int64_t i = 0; i < k; ++i) {
        const double want = bf16_to_f32(xb[size_t(r * k + staged_column(i))]);
        const double f = f16_to_double(h16[size_t(r * k + i)]);
        top = std::max(top, std::fabs(f));
        const double back = f * std::ldexp(1.0, -e);
        if (!std::isfinite(want)) {
          bad += !(back == want);
        } else if (std::fabs(want) >= std::ldexp(double(m), -31)) {
          bad += back != want;
        } else {
          bad += std::fabs(back - want) > std::ldexp(1.0, -25 - e);
        }
      }
      EXPECT_EQ(bad, 0) << "k " << k << " row " << r << " e " << e;
      if (finite && m > 0 && e > -126 && e < 126) {
        EXPECT_GE(top, 16384.0) << "k " << k << " row " << r;
        EXPECT_LT(top, 32768.0) << "k " << k << " row " << r;
      }
    }
  }
}

TEST(MoeFp8F16, RowsOfAnyMagnitudeMatchCpu) {
  Stream s;
  std::mt19937 rng(43);
  cpu::CpuBackend cpu;
  const int64_t hidden = 384, inter = 256, tokens = 9;
  const int experts = 16, k = 4;
  const HostLinearWeight gu = random_stack(rng, Fmt::kFp8, experts, 2 * inter, hidden);
  const HostLinearWeight dn = random_stack(rng, Fmt::kFp8, experts, hidden, inter);
  DevStack d_gu = to_device(gu, Fmt::kFp8, s), d_dn = to_device(dn, Fmt::kFp8, s);
  MoeExpertWeights cw;
  cw.gate_up.weight = cpu_weight(cpu, gu);
  cw.gate_up.stack = experts;
  cw.down.weight = cpu_weight(cpu, dn);
  cw.down.stack = experts;
  // Token t's x times 2^(-30 + 7.5 t): 2^-30 .. 2^30.
  std::vector<float> x = random_bf16(rng, tokens * hidden, 1.0f);
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t i = 0; i < hidden; ++i)
      x[size_t(t * hidden + i)] =
          round_to_bf16(std::ldexp(x[size_t(t * hidden + i)], int(-30 + 7.5 * double(t))));
  std::vector<int32_t> ids(size_t(tokens * k));
  std::vector<float> wts(size_t(tokens * k));
  for (int64_t t = 0; t < tokens; ++t)
    for (int j = 0; j < k; ++j) {
      ids[size_t(t * k + j)] = int32_t((t * 5 + j * 3) % experts);
      wts[size_t(t * k + j)] = 0.25f + 0.1f * float(j);
    }
  HostTensor hx(DType::kF32, {tokens, hidden}), hids(DType::kI32, {tokens, k}),
      hw(DType::kF32, {tokens, k}), ho(DType::kF32, {tokens, hidden});
  std::memcpy(hx.f32(), x.data(), x.size() * 4);
  std::memcpy(hids.view.ptr<int32_t>(), ids.data(), ids.size() * 4);
  std::memcpy(hw.f32(), wts.data(), wts.size() * 4);
  cpu.moe_experts(hx.view, cw, hids.view, hw.view, ho.view);

  auto dx = upload(to_bits(x), s), d_ids = upload(ids, s), d_w = upload(wts, s);
  const size_t scratch_bytes = cuda::moe_experts_scratch_bytes(tokens, k, experts, hidden, inter);
  Dev scratch(scratch_bytes), out(size_t(tokens * hidden + kGuard) * 2);
  CUDA_CHECK(cudaMemsetAsync(scratch.as<void>(), 0xff, scratch_bytes, s.get()));
  CUDA_CHECK(cudaMemsetAsync(out.as<void>(), 0xff, out.bytes(), s.get()));
  cuda::MoeExpertsParams p{};
  p.x = dx->as<bf16_bits>();
  p.topk_ids = d_ids->as<int32_t>();
  p.topk_weights = d_w->as<float>();
  p.out = out.as<bf16_bits>();
  p.scratch = scratch.as<void>();
  p.gate_up = d_gu.view;
  p.down = d_dn.view;
  p.tokens = tokens;
  p.top_k = k;
  p.num_experts = experts;
  p.regime = cuda::kMoeDecode;
  p.fp8_f16 = 1;
  cuda::launch_moe_experts(p, s.get());
  bool guard = false;
  const std::vector<float> got = from_bits(read_output(out, tokens * hidden, s, &guard));
  EXPECT_TRUE(guard) << "wrote past the output";
  for (int64_t t = 0; t < tokens; ++t) {
    const std::vector<float> g(got.begin() + t * hidden, got.begin() + (t + 1) * hidden);
    const std::vector<double> w(ho.f32() + t * hidden, ho.f32() + (t + 1) * hidden);
    const double e = nmse(g, w);
    EXPECT_LT(e, 4e-5) << "token " << t;
    std::printf("fp8 f16 token %lld (x · 2^%d): NMSE %.2e\n", static_cast<long long>(t),
                int(-30 + 7.5 * double(t)), e);
  }
}

}  // namespace
}  // namespace strata::parity
