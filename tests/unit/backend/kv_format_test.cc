// KV row formats: plain fp8 with scales, MLA rows with a bf16 rope part, FlashMLA FP8 rows.
#include "backend/kv_format.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

namespace strata {
namespace {

std::vector<float> random_row(int n, float amp, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, amp);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng);
  return v;
}

KvLayout mla_layout(DType dt, int latent, int rope) {
  KvLayout l;
  l.num_layers = 2;
  l.num_pages = 1;
  l.k_dim = latent + rope;
  l.dtype = dt;
  l.rope_dim = rope;
  return l;
}

TEST(KvFormat, FlashMlaRowIs656BytesForDeepSeekV3) {
  KvLayout l = mla_layout(DType::kFP8E4M3, 512, 64);
  l.format = KvFormat::kFlashMlaFp8;
  EXPECT_TRUE(l.k_row_is_split(0));
  EXPECT_EQ(l.k_row_bytes(0), 656);
  l.layer_dtypes = {DType::kBF16, DType::kFP8E4M3};  // a bf16 layer stays plain
  EXPECT_FALSE(l.k_row_is_split(0));
  EXPECT_EQ(l.k_row_bytes(0), 576 * 2);
  EXPECT_EQ(l.bytes_per_token(), 576 * 2 + 656);
}

TEST(KvFormat, PlainFp8RowUsesTheScale) {
  KvLayout l = mla_layout(DType::kFP8E4M3, 24, 8);
  l.rope_dim = 0;
  const std::vector<float> x = random_row(32, 0.01f, 1);
  std::vector<uint8_t> row(size_t(l.k_row_bytes(0)));
  std::vector<float> back(32);
  // With scale amax/448 the values use e4m3's normal range: relative error <= 2^-4.
  float amax = 0;
  for (float v : x) amax = std::max(amax, std::fabs(v));
  const float scale = amax / 448.0f;
  encode_k_row(l, 0, x.data(), scale, row.data());
  decode_k_row(l, 0, row.data(), scale, back.data());
  for (int i = 0; i < 32; ++i)
    EXPECT_NEAR(back[size_t(i)], x[size_t(i)], std::fabs(x[size_t(i)]) / 16 + 1e-12) << i;
  // The stored byte is the e4m3 of value / scale.
  EXPECT_EQ(row[0], f32_to_fp8_e4m3(x[0] / scale));
}

TEST(KvFormat, MlaRopePartInBf16) {
  KvLayout l = mla_layout(DType::kFP8E5M2, 64, 16);
  l.rope_dtype = DType::kBF16;
  EXPECT_EQ(l.k_row_bytes(0), 64 + 32);
  const std::vector<float> x = random_row(80, 3.0f, 2);
  std::vector<uint8_t> row(size_t(l.k_row_bytes(0)));
  std::vector<float> back(80);
  encode_k_row(l, 0, x.data(), 2.0f, row.data());
  decode_k_row(l, 0, row.data(), 2.0f, back.data());
  for (int i = 0; i < 64; ++i)  // latent: e5m2 of x / 2, times 2
    EXPECT_EQ(back[size_t(i)], 2.0f * fp8_e5m2_to_f32(f32_to_fp8_e5m2(x[size_t(i)] / 2.0f))) << i;
  for (int i = 64; i < 80; ++i)  // rope: bf16, unscaled
    EXPECT_EQ(back[size_t(i)], round_to_bf16(x[size_t(i)])) << i;
}

TEST(KvFormat, FlashMlaTilesHaveTheirOwnScales) {
  KvLayout l = mla_layout(DType::kFP8E4M3, 256, 32);
  l.format = KvFormat::kFlashMlaFp8;
  std::vector<float> x = random_row(288, 1.0f, 3);
  for (int i = 128; i < 256; ++i) x[size_t(i)] *= 1000.0f;  // the second tile is much larger
  std::vector<uint8_t> row(size_t(l.k_row_bytes(0)));
  ASSERT_EQ(row.size(), 256u + 2 * 4 + 64);
  std::vector<float> back(288);
  encode_k_row(l, 0, x.data(), 123.0f /* ignored */, row.data());
  decode_k_row(l, 0, row.data(), 123.0f, back.data());
  for (int t = 0; t < 2; ++t) {
    float amax = 0, s = 0;
    for (int i = 0; i < 128; ++i) amax = std::max(amax, std::fabs(x[size_t(t * 128 + i)]));
    std::memcpy(&s, row.data() + 256 + t * 4, 4);
    EXPECT_FLOAT_EQ(s, amax / 448.0f);
    for (int i = t * 128; i < t * 128 + 128; ++i)
      EXPECT_EQ(back[size_t(i)], s * fp8_e4m3_to_f32(f32_to_fp8_e4m3(x[size_t(i)] / s))) << i;
  }
  for (int i = 256; i < 288; ++i) EXPECT_EQ(back[size_t(i)], round_to_bf16(x[size_t(i)]));
}

TEST(KvFormat, CpuStorageAllocatesSplitRowsAsBytes) {
  auto be = make_cpu_backend();
  KvLayout l = mla_layout(DType::kFP8E4M3, 128, 32);
  l.num_pages = 3;
  l.page_size = 4;
  l.format = KvFormat::kFlashMlaFp8;
  l.layer_dtypes = {DType::kFP8E4M3, DType::kBF16};
  auto kv = be->alloc_kv(l);
  EXPECT_EQ(kv->k(0).dtype, DType::kU8);
  EXPECT_EQ(kv->k(0).shape, (Shape{3, 4, 128 + 4 + 64}));
  EXPECT_EQ(kv->k(1).dtype, DType::kBF16);
  EXPECT_EQ(kv->k(1).shape, (Shape{3, 4, 160}));
}

}  // namespace
}  // namespace strata
