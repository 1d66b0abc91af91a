#include "core/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace strata {
namespace {

struct Fp8Case {
  const char* name;
  float (*decode)(uint8_t);
  uint8_t (*encode)(float);
  int mbits;
  float max;
};

class Fp8Test : public ::testing::TestWithParam<Fp8Case> {};

// Every code decodes to its OCP value and every non-NaN code round-trips (including -0).
TEST_P(Fp8Test, AllCodesRoundTrip) {
  const auto& c = GetParam();
  int nan_codes = 0;
  for (int code = 0; code < 256; ++code) {
    float v = c.decode(uint8_t(code));
    if (std::isnan(v)) {
      ++nan_codes;
      EXPECT_TRUE(std::isnan(c.decode(c.encode(v)))) << code;
      continue;
    }
    if (std::isinf(v)) {  // e5m2 infinities: saturating conversion maps them to ±max
      EXPECT_EQ(c.decode(c.encode(v)), std::copysign(c.max, v));
      continue;
    }
    EXPECT_EQ(c.encode(v), code) << c.name << " code " << code << " value " << v;
  }
  // e4m3fn: only S.1111.111 is NaN (2 codes); e5m2: exponent 11111 with mantissa != 0 (6 codes).
  EXPECT_EQ(nan_codes, c.mbits == 3 ? 2 : 6);
}

// Midpoints between neighbours round to the code with an even mantissa; just off the midpoint
// rounds to the nearer one.
TEST_P(Fp8Test, RoundsToNearestEven) {
  const auto& c = GetParam();
  for (int code = 0; code < 127; ++code) {
    float lo = c.decode(uint8_t(code)), hi = c.decode(uint8_t(code + 1));
    if (std::isnan(lo) || std::isnan(hi) || std::isinf(hi)) continue;
    float mid = (lo + hi) / 2;  // exact in float for these formats
    uint8_t even = (code % 2 == 0) ? uint8_t(code) : uint8_t(code + 1);
    EXPECT_EQ(c.encode(mid), even) << c.name << " between codes " << code << "," << code + 1;
    EXPECT_EQ(c.encode(-mid), even | 0x80) << c.name;
    float below = std::nextafter(mid, lo), above = std::nextafter(mid, hi);
    EXPECT_EQ(c.encode(below), code) << c.name;
    EXPECT_EQ(c.encode(above), code + 1) << c.name;
  }
}

TEST_P(Fp8Test, SaturatesAndKeepsNan) {
  const auto& c = GetParam();
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(c.decode(c.encode(1e9f)), c.max);
  EXPECT_EQ(c.decode(c.encode(-1e9f)), -c.max);
  EXPECT_EQ(c.decode(c.encode(inf)), c.max);
  EXPECT_EQ(c.decode(c.encode(-inf)), -c.max);
  EXPECT_EQ(c.decode(c.encode(c.max * 1.01f)), c.max);
  EXPECT_TRUE(std::isnan(c.decode(c.encode(std::nanf("")))));
  EXPECT_EQ(c.encode(0.0f), 0);
  EXPECT_EQ(c.encode(-0.0f), 0x80);
}

INSTANTIATE_TEST_SUITE_P(
    Ocp, Fp8Test,
    ::testing::Values(Fp8Case{"e4m3", fp8_e4m3_to_f32, f32_to_fp8_e4m3, 3, kFp8E4M3Max},
                      Fp8Case{"e5m2", fp8_e5m2_to_f32, f32_to_fp8_e5m2, 2, kFp8E5M2Max}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(Fp8, KnownValues) {
  EXPECT_EQ(fp8_e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(fp8_e4m3_to_f32(0x08), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(fp8_e4m3_to_f32(0x38), 1.0f);
  EXPECT_EQ(fp8_e5m2_to_f32(0x7b), 57344.0f);
  EXPECT_TRUE(std::isinf(fp8_e5m2_to_f32(0x7c)));
  EXPECT_EQ(fp8_e5m2_to_f32(0x01), std::ldexp(1.0f, -16));
  EXPECT_EQ(fp8_e5m2_to_f32(0x3c), 1.0f);
  // Below half the smallest subnormal rounds to zero; exactly half ties to even (zero).
  EXPECT_EQ(f32_to_fp8_e4m3(std::ldexp(1.0f, -10)), 0);
  EXPECT_EQ(f32_to_fp8_e4m3(std::ldexp(1.5f, -10)), 1);
}

TEST(Bf16, RoundTripAndRounding) {
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = bf16_to_f32(uint16_t(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(f))));
      continue;
    }
    EXPECT_EQ(f32_to_bf16(f), h);
  }
  // 1 + 2^-8 is the midpoint between 1 and 1 + 2^-7: ties to even (1.0).
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + std::ldexp(1.0f, -8))), 1.0f);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8))), 1.0f + std::ldexp(1.0f, -6));
}

TEST(F16, RoundTripAndOverflow) {
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = f16_to_f32(uint16_t(h));
    if (std::isnan(f)) continue;
    EXPECT_EQ(f32_to_f16(f), h) << h;
  }
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0x7bff), 65504.0f);
  EXPECT_TRUE(std::isinf(f16_to_f32(f32_to_f16(70000.0f))));
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));
}

TEST(Int4, Nibbles) {
  EXPECT_EQ(int4_from_nibble(0), -8);
  EXPECT_EQ(int4_from_nibble(8), 0);
  EXPECT_EQ(int4_from_nibble(15), 7);
  uint32_t packed = 0x76543210u;
  for (int i = 0; i < 8; ++i) EXPECT_EQ(int4_from_nibble(packed >> (4 * i)), i - 8);
}

}  // namespace
}  // namespace strata
