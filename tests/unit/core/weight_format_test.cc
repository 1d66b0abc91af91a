// core/weight_format: the bytes formula, and that slicing / fusing / stacking stored bytes gives
// the same float32 weights as slicing / fusing / stacking the dequantized matrices.
#include "core/weight_format.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>

namespace strata {
namespace {

// A random matrix [out, in] stored in `f` (fp8 values finite; int4 scales positive bf16).
HostLinearWeight random_linear(const LinearFormat& f, int64_t out, int64_t in, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  HostLinearWeight w;
  w.format = f;
  w.out = out;
  w.in = in;
  w.values.resize(size_t(w.matrix_values_bytes()));
  w.scales.resize(size_t(w.matrix_scales_bytes()));
  switch (f.format) {
    case WeightFormat::kDense: {
      std::vector<float> v(size_t(out * in));
      for (float& x : v) x = u(rng);
      from_f32(f.dense_dtype, v.data(), w.values.data(), out * in);
      break;
    }
    case WeightFormat::kFp8Block: {
      for (uint8_t& b : w.values) b = f32_to_fp8_e4m3(u(rng) * 400.0f);
      for (int64_t i = 0; i < int64_t(w.scales.size()) / 4; ++i) {
        const float s = 1e-3f * (1.0f + std::abs(u(rng)));
        std::memcpy(w.scales.data() + i * 4, &s, 4);
      }
      break;
    }
    case WeightFormat::kInt4Group: {
      for (uint8_t& b : w.values) b = uint8_t(rng());
      for (int64_t i = 0; i < int64_t(w.scales.size()) / 2; ++i) {
        const uint16_t s = f32_to_bf16(0.01f * (1.0f + std::abs(u(rng))));
        std::memcpy(w.scales.data() + i * 2, &s, 2);
      }
      break;
    }
  }
  return w;
}

std::vector<float> dense(const HostLinearWeight& w) {
  std::vector<float> d(size_t(w.stack * w.out * w.in));
  dequantize_linear(w, d.data());
  return d;
}

const LinearFormat kBf16{.format = WeightFormat::kDense, .dense_dtype = DType::kBF16};
const LinearFormat kFp8{.format = WeightFormat::kFp8Block, .block_out = 128, .block_in = 128};
const LinearFormat kInt4g32{.format = WeightFormat::kInt4Group, .group_size = 32};

TEST(WeightFormat, BytesFormula) {
  // bf16: 2 bytes a value.
  EXPECT_EQ(linear_weight_bytes(kBf16, 6144, 4096), 6144LL * 4096 * 2);
  // fp8 128x128: 1 byte a value + one float32 per (partial) block: 7168x576 has 57 × 5 blocks.
  EXPECT_EQ(linear_weight_bytes(kFp8, 576, 7168), 576LL * 7168 + 5LL * 56 * 4);
  // int4 group 32: half a byte a value + one bf16 per 32 values of a row.
  EXPECT_EQ(linear_weight_bytes(kInt4g32, 2048, 7168), 2048LL * 7168 / 2 + 2048LL * 7168 / 32 * 2);
  EXPECT_EQ(linear_scales_bytes(kBf16, 10, 10), 0);
}

TEST(WeightFormat, DequantizeInt4MatchesNibbleRule) {
  HostLinearWeight w = random_linear(kInt4g32, 3, 64, 1);
  const std::vector<float> d = dense(w);
  for (int64_t r = 0; r < 3; ++r)
    for (int64_t c = 0; c < 64; ++c) {
      uint32_t word;
      std::memcpy(&word, w.values.data() + (r * 8 + c / 8) * 4, 4);
      uint16_t s;
      std::memcpy(&s, w.scales.data() + (r * 2 + c / 32) * 2, 2);
      const float want =
          round_to_bf16(float(int((word >> (4 * (c % 8))) & 0xf) - 8) * bf16_to_f32(s));
      ASSERT_EQ(d[size_t(r * 64 + c)], want) << r << "," << c;
    }
}

// Slicing stored bytes equals slicing the dequantized matrix, for every format.
void expect_slices_agree(const LinearFormat& f, int64_t out, int64_t in, int64_t r0, int64_t r1,
                         int64_t c0, int64_t c1) {
  const HostLinearWeight w = random_linear(f, out, in, 7);
  const std::vector<float> full = dense(w);
  auto rows = slice_linear_rows(w, r0, r1, "w");
  ASSERT_TRUE(rows.ok()) << rows.status().message();
  const std::vector<float> dr = dense(*rows);
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t c = 0; c < in; ++c)
      ASSERT_EQ(dr[size_t((r - r0) * in + c)], full[size_t(r * in + c)]);
  auto cols = slice_linear_cols(w, c0, c1, "w");
  ASSERT_TRUE(cols.ok()) << cols.status().message();
  const std::vector<float> dc = dense(*cols);
  for (int64_t r = 0; r < out; ++r)
    for (int64_t c = c0; c < c1; ++c)
      ASSERT_EQ(dc[size_t(r * (c1 - c0) + c - c0)], full[size_t(r * in + c)]);
}

TEST(WeightFormat, SlicesAgreeWithDequantizedSlices) {
  expect_slices_agree(kBf16, 7, 9, 2, 5, 3, 8);
  expect_slices_agree(kFp8, 300, 260, 128, 300, 128, 260);  // partial last blocks
  expect_slices_agree(kInt4g32, 5, 128, 1, 4, 32, 96);
}

TEST(WeightFormat, MisalignedSlicesAreErrors) {
  const HostLinearWeight f8 = random_linear(kFp8, 256, 256, 3);
  EXPECT_FALSE(slice_linear_rows(f8, 64, 192, "x").ok());
  EXPECT_FALSE(slice_linear_cols(f8, 0, 100, "x").ok());
  const HostLinearWeight i4 = random_linear(kInt4g32, 4, 128, 3);
  auto bad = slice_linear_cols(i4, 16, 64, "experts.3.down_proj.weight");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("experts.3.down_proj.weight"), std::string::npos);
}

TEST(WeightFormat, ConcatRowsIsRowConcatenation) {
  for (const LinearFormat& f : {kBf16, kInt4g32, kFp8}) {
    const int64_t a = f.format == WeightFormat::kFp8Block ? 128 : 3;
    const HostLinearWeight p0 = random_linear(f, a, 160 * 2, 1),
                           p1 = random_linear(f, 5, 160 * 2, 2);
    const std::vector<float> d0 = dense(p0), d1 = dense(p1);
    auto cat = concat_linear_rows({p0, p1}, "qkv");
    ASSERT_TRUE(cat.ok()) << cat.status().message();
    EXPECT_EQ(cat->out, a + 5);
    std::vector<float> want = d0;
    want.insert(want.end(), d1.begin(), d1.end());
    EXPECT_EQ(dense(*cat), want) << f.str();
  }
}

TEST(WeightFormat, ConcatRefusesWhatItCannotRepresent) {
  // fp8 parts whose rows straddle a scale block.
  EXPECT_FALSE(
      concat_linear_rows({random_linear(kFp8, 100, 128, 1), random_linear(kFp8, 28, 128, 2)}, "x")
          .ok());
  // Different formats.
  EXPECT_FALSE(
      concat_linear_rows({random_linear(kInt4g32, 4, 64, 1), random_linear(kBf16, 4, 64, 2)}, "x")
          .ok());
  // Dense parts of different dtypes are widened, not refused.
  const LinearFormat f16{.format = WeightFormat::kDense, .dense_dtype = DType::kF16};
  auto mixed =
      concat_linear_rows({random_linear(kBf16, 2, 8, 1), random_linear(f16, 3, 8, 2)}, "x");
  ASSERT_TRUE(mixed.ok());
  EXPECT_EQ(mixed->format.dense_dtype, DType::kF32);
}

TEST(WeightFormat, StackKeepsEachMatrix) {
  std::vector<HostLinearWeight> parts;
  std::vector<float> want;
  for (uint32_t e = 0; e < 3; ++e) {
    parts.push_back(random_linear(kInt4g32, 6, 64, 10 + e));
    const std::vector<float> d = dense(parts.back());
    want.insert(want.end(), d.begin(), d.end());
  }
  auto st = stack_linears(parts, "experts");
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->stack, 3);
  EXPECT_EQ(st->bytes(), 3 * linear_weight_bytes(kInt4g32, 6, 64));
  EXPECT_EQ(dense(*st), want);
  // Slicing a stack slices every matrix.
  auto half = slice_linear_cols(*st, 32, 64, "experts");
  ASSERT_TRUE(half.ok());
  const std::vector<float> dh = dense(*half);
  for (int64_t e = 0; e < 3; ++e)
    for (int64_t r = 0; r < 6; ++r)
      for (int64_t c = 0; c < 32; ++c)
        ASSERT_EQ(dh[size_t((e * 6 + r) * 32 + c)], want[size_t((e * 6 + r) * 64 + 32 + c)]);
}

}  // namespace
}  // namespace strata
