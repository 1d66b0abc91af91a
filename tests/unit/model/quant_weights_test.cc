// Dequantizing weights through WeightStore::load_f32: the INT4 fixture checked against a
// hand unpacking written here, fp8 blocks checked against hand-picked codes, and the errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>

#include "model/config.h"
#include "model/quant.h"
#include "model/weights.h"
#include "support/temp_dir.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

const std::string kInt4Dir =
    std::string(STRATA_SHARED_DIR) + "/fixtures/tiny/deepseek-v3-int4-experts";

// bf16 rounding written independently of core/dtype: round half to even on the top 16 bits,
// done in double on the exact product.
float to_bf16_independent(double x) {
  float f = float(x);  // exact here: |int4| * bf16 fits in 12 significant bits
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  uint32_t upper = bits >> 16, lower = bits & 0xffff;
  if (lower > 0x8000 || (lower == 0x8000 && (upper & 1))) ++upper;
  uint32_t out = upper << 16;
  float r;
  std::memcpy(&r, &out, 4);
  return r;
}

float bf16_bits_to_float(const uint8_t* p) {
  uint32_t bits = uint32_t(p[0]) << 16 | uint32_t(p[1]) << 24;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Element (r, c) of a compressed-tensors pack-quantized weight, straight from the raw bytes:
// int32 little-endian words, 8 nibbles per word along the input dim, low nibble first.
double hand_dequant(const TensorInfo& packed, const TensorInfo& scale, int64_t r, int64_t c,
                    int64_t group, bool* rounding_mattered) {
  const int64_t words_per_row = packed.shape[1];
  const uint8_t* word = packed.data + (r * words_per_row + c / 8) * 4;
  int shift = int(c % 8) * 4;
  uint8_t byte = word[shift / 8];
  int nibble = (shift % 8 == 0) ? (byte & 0xf) : (byte >> 4);
  int q = nibble - 8;
  const int64_t groups = scale.shape[1];
  float s = bf16_bits_to_float(scale.data + (r * groups + c / group) * 2);
  double exact = double(q) * double(s);
  float rounded = to_bf16_independent(exact);
  if (double(rounded) != exact) *rounding_mattered = true;
  return rounded;
}

TEST(Int4Test, FixtureExpertsMatchHandUnpacking) {
  auto spec = load_model_spec(kInt4Dir);
  ASSERT_TRUE(spec.ok()) << spec.status().to_string();
  auto ws = WeightStore::open(kInt4Dir, spec->quant);
  ASSERT_TRUE(ws.ok()) << ws.status().to_string();
  bool rounding_mattered = false;
  int checked = 0;
  for (int layer : {1, 2}) {
    for (int e : {0, 5, 7}) {
      for (const char* proj : {"gate_proj", "up_proj", "down_proj"}) {
        const std::string name = "model.layers." + std::to_string(layer) + ".mlp.experts." +
                                 std::to_string(e) + "." + proj + ".weight";
        const bool down = std::string(proj) == "down_proj";
        const Shape shape = down ? Shape{64, 32} : Shape{32, 64};
        ASSERT_TRUE(ws->contains(name)) << name;
        EXPECT_TRUE(ws->is_quantized(name));
        EXPECT_EQ(ws->find(name), nullptr);  // only the packed form is stored
        const TensorInfo* packed = ws->find(name + "_packed");
        const TensorInfo* scale = ws->find(name + "_scale");
        ASSERT_NE(packed, nullptr);
        ASSERT_NE(scale, nullptr);
        EXPECT_EQ(packed->dtype, DType::kI32);
        auto shp = ws->shape_of(name);
        ASSERT_TRUE(shp.ok());
        EXPECT_EQ(*shp, shape);
        auto w = ws->load_f32(name, shape);
        ASSERT_TRUE(w.ok()) << w.status().to_string();
        for (int64_t r = 0; r < shape[0]; ++r) {
          for (int64_t c = 0; c < shape[1]; ++c) {
            double want = hand_dequant(*packed, *scale, r, c, 32, &rounding_mattered);
            ASSERT_EQ(double(w->f32()[r * shape[1] + c]), want)
                << name << " [" << r << ", " << c << "]";
            ++checked;
          }
        }
      }
    }
  }
  EXPECT_EQ(checked, 2 * 3 * 3 * 2048);
  EXPECT_TRUE(rounding_mattered);  // the fixture exercises the bf16 rounding

  // A few elements by hand from the first word of layer 1, expert 0, gate_proj.
  const TensorInfo* p = ws->find("model.layers.1.mlp.experts.0.gate_proj.weight_packed");
  const TensorInfo* s = ws->find("model.layers.1.mlp.experts.0.gate_proj.weight_scale");
  uint32_t word0 = uint32_t(p->data[0]) | uint32_t(p->data[1]) << 8 | uint32_t(p->data[2]) << 16 |
                   uint32_t(p->data[3]) << 24;
  float s0 = bf16_bits_to_float(s->data);
  auto w = ws->load_f32("model.layers.1.mlp.experts.0.gate_proj.weight");
  ASSERT_TRUE(w.ok());
  for (int k = 0; k < 8; ++k) {
    int q = int((word0 >> (4 * k)) & 0xf) - 8;
    EXPECT_EQ(w->f32()[k], to_bf16_independent(double(q) * s0)) << k;
  }

  // Unquantized weights of the same checkpoint load as before.
  auto shared = ws->load_f32("model.layers.1.mlp.shared_experts.up_proj.weight", {32, 64});
  ASSERT_TRUE(shared.ok());
  EXPECT_FALSE(ws->is_quantized("model.layers.1.mlp.shared_experts.up_proj.weight"));
  EXPECT_TRUE(is_quantized_module(spec->quant, "model.layers.1.mlp.experts.3.up_proj"));
  EXPECT_FALSE(is_quantized_module(spec->quant, "model.layers.1.mlp.shared_experts.up_proj"));
}

using strata::testing::TempDir;

std::vector<uint8_t> raw_bytes(const TensorInfo& t) { return {t.data, t.data + t.nbytes}; }

// Copies some tensors of the INT4 fixture into a fresh checkpoint.
void copy_subset(const WeightStore& src, const std::vector<std::string>& names,
                 const std::string& dir) {
  std::vector<SafetensorsEntry> entries;
  for (const std::string& n : names) {
    const TensorInfo* t = src.find(n);
    ASSERT_NE(t, nullptr) << n;
    entries.push_back({.name = n, .dtype = t->dtype, .shape = t->shape, .bytes = raw_bytes(*t)});
  }
  ASSERT_TRUE(write_safetensors(dir + "/model.safetensors", entries).ok());
}

TEST(Int4Test, MissingScaleAndBadGroupSize) {
  auto src = WeightStore::open(kInt4Dir);
  ASSERT_TRUE(src.ok());
  const std::string m = "model.layers.1.mlp.experts.0.gate_proj.weight";
  TempDir d;
  copy_subset(*src, {m + "_packed", m + "_shape"}, d.str());
  auto ws = WeightStore::open(d.str());
  ASSERT_TRUE(ws.ok());
  EXPECT_TRUE(ws->contains(m));
  auto w = ws->load_f32(m, {32, 64});
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(w.status().message(), HasSubstr("has no scale tensor '" + m + "_scale'"));
  EXPECT_THAT(w.status().message(), HasSubstr("model.safetensors"));

  TempDir d2;
  copy_subset(*src, {m + "_packed", m + "_shape", m + "_scale"}, d2.str());
  QuantSpec q;
  q.method = QuantMethod::kInt4PackQuantized;
  q.group_size = 48;
  auto ws2 = WeightStore::open(d2.str(), q);
  ASSERT_TRUE(ws2.ok());
  auto w2 = ws2->load_f32(m, {32, 64});
  ASSERT_FALSE(w2.ok());
  EXPECT_THAT(w2.status().message(), HasSubstr("group size 48 does not divide the input dim 64"));
  // Without a spec the group size comes from the scale shape.
  auto ws3 = WeightStore::open(d2.str());
  ASSERT_TRUE(ws3.ok());
  EXPECT_TRUE(ws3->load_f32(m, {32, 64}).ok());
  // A group size that divides but disagrees with the scale tensor.
  QuantSpec q16;
  q16.method = QuantMethod::kInt4PackQuantized;
  q16.group_size = 16;
  auto ws4 = WeightStore::open(d2.str(), q16);
  ASSERT_TRUE(ws4.ok());
  auto w4 = ws4->load_f32(m, {32, 64});
  ASSERT_FALSE(w4.ok());
  EXPECT_THAT(w4.status().message(), HasSubstr("expected 4 groups of 16 per row, scale has 2"));
}

TEST(Fp8Test, BlockDequantRoundsToBf16) {
  // [130, 260] weight: 2 x 3 blocks of 128 x 128, the last ones partial.
  const int64_t out = 130, in = 260;
  std::vector<uint8_t> w(out * in, 0x38);                            // e4m3 0x38 = 1.0
  w[0] = 0x39;                                                       // 1.125
  w[1] = 0xB8;                                                       // -1.0
  w[129 * in + 259] = 0x40;                                          // 2.0, in block (1, 2)
  std::vector<float> scale = {1.1f, 2.0f, 3.0f, 0.5f, 0.25f, 4.0f};  // [2, 3]
  std::vector<uint8_t> scale_bytes(scale.size() * 4);
  std::memcpy(scale_bytes.data(), scale.data(), scale_bytes.size());
  TempDir d;
  ASSERT_TRUE(
      write_safetensors(
          d.file("model.safetensors"),
          {{.name = "l.weight", .dtype = DType::kFP8E4M3, .shape = {out, in}, .bytes = w},
           {.name = "l.weight_scale_inv",
            .dtype = DType::kF32,
            .shape = {2, 3},
            .bytes = scale_bytes},
           {.name = "bare.weight", .dtype = DType::kFP8E4M3, .shape = {2}, .bytes = {0x38, 0x38}}})
          .ok());
  QuantSpec q;
  q.method = QuantMethod::kFp8Block;
  q.weight_block_size = {128, 128};
  auto ws = WeightStore::open(d.str(), q);
  ASSERT_TRUE(ws.ok()) << ws.status().to_string();
  EXPECT_TRUE(ws->is_quantized("l.weight"));
  auto t = ws->load_f32("l.weight", {out, in});
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  const float* v = t->f32();
  // 1.125 * 1.1f = 1.2375..., which bf16 (spacing 2^-7 there) rounds to 1.234375.
  EXPECT_EQ(v[0], 1.234375f);
  EXPECT_EQ(v[1], -1.1015625f);  // -1.1f rounded to bf16
  EXPECT_EQ(v[128], 2.0f);       // block (0, 1)
  EXPECT_EQ(v[256], 3.0f);       // block (0, 2)
  EXPECT_EQ(v[128 * in], 0.5f);  // block (1, 0)
  EXPECT_EQ(v[129 * in + 130], 0.25f);
  EXPECT_EQ(v[129 * in + 259], 8.0f);

  auto bare = ws->load_f32("bare.weight");
  ASSERT_FALSE(bare.ok());
  EXPECT_THAT(bare.status().message(), HasSubstr("no block scale tensor 'bare.weight_scale_inv'"));
}

}  // namespace
}  // namespace strata
