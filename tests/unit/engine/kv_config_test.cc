// KV configuration: options -> config, scales files, layer lists, record identity keys.
#include "engine/kv_config.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/parse_enum.h"
#include "model/config.h"

namespace strata {
namespace {

std::string model_dir(const char* name) {
  return std::string(STRATA_SHARED_DIR) + "/models/" + name;
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("strata_evalkv_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

TEST(KvConfig, ScalesRoundTripThroughTheFile) {
  KvScales s;
  s.k = {0.5f, 0.0123456789f, 3.0f};
  s.v = {1.0f, 2.5e-3f, 7.0f};
  const std::string path = temp_path("scales.json");
  ASSERT_TRUE(write_kv_scales(path, s, {{"model", "x"}}).ok());
  auto back = read_kv_scales(path, 3);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->k, s.k);  // bit-exact: JSON keeps every float32 digit
  EXPECT_EQ(back->v, s.v);
  EXPECT_EQ(back->source, "file:" + path);
  auto wrong_layers = read_kv_scales(path, 4);
  EXPECT_FALSE(wrong_layers.ok());
  EXPECT_NE(wrong_layers.status().to_string().find("3 k and 3 v scales for a model of 4 layers"),
            std::string::npos);
  std::ofstream(path)
      << R"({"format": "strata-kv-scales/1", "k_scale": [1, 0, 1], "v_scale": [1, 1, 1]})";
  auto zero = read_kv_scales(path, 3);
  EXPECT_FALSE(zero.ok());
  EXPECT_NE(zero.status().to_string().find("layer 1 scale 0"), std::string::npos);
  std::filesystem::remove(path);
  EXPECT_FALSE(read_kv_scales(path, 3).ok());
}

TEST(KvConfig, ResolvesLlamaOptions) {
  auto spec = load_model_spec(model_dir("house-llama"));
  ASSERT_TRUE(spec.ok());
  auto exact = resolve_kv_cache_config({.dtype = KvCacheDtype::kAuto}, *spec, nullptr, DType::kF32);
  ASSERT_TRUE(exact.ok());
  EXPECT_EQ(exact->dtype, DType::kF32);
  EXPECT_FALSE(exact->lossy());
  auto fp8 = resolve_kv_cache_config({.dtype = KvCacheDtype::kFp8E4M3, .bf16_layers = {7, 0, 7}},
                                     *spec, nullptr, DType::kF32);
  ASSERT_TRUE(fp8.ok());
  EXPECT_TRUE(fp8->lossy());
  EXPECT_EQ(fp8->bf16_layers, (std::vector<int>{0, 7}));
  EXPECT_EQ(fp8->layer_dtype(0), DType::kBF16);
  EXPECT_EQ(fp8->layer_dtype(3), DType::kFP8E4M3);
  auto all_bf16 = resolve_kv_cache_config(
      {.dtype = KvCacheDtype::kFp8E4M3, .bf16_layers = {0, 1, 2, 3, 4, 5, 6, 7}}, *spec, nullptr,
      DType::kF32);
  ASSERT_TRUE(all_bf16.ok());
  EXPECT_FALSE(all_bf16->lossy());
  EXPECT_FALSE(resolve_kv_cache_config({.dtype = KvCacheDtype::kFp8E4M3, .bf16_layers = {8}}, *spec,
                                       nullptr, DType::kF32)
                   .ok());
  EXPECT_FALSE(
      resolve_kv_cache_config({.dtype = KvCacheDtype::kFp8FlashMla}, *spec, nullptr, DType::kF32)
          .ok());
  EXPECT_FALSE(
      resolve_kv_cache_config({.dtype = KvCacheDtype::kFp8E4M3, .mla_rope_dtype = DType::kBF16},
                              *spec, nullptr, DType::kF32)
          .ok());
  EXPECT_FALSE(parse_enum<KvCacheDtype>("int4", "--kv-cache-dtype").ok());  // a name no table holds
  EXPECT_EQ(*parse_enum<KvCacheDtype>("bfloat16", "--kv-cache-dtype"),
            KvCacheDtype::kBF16);  // an alias

  // The key names everything that changes the stored bytes, scale values included.
  KvCacheConfig a = *fp8, b = *fp8;
  b.scales.k[3] = 0.5f;
  EXPECT_NE(a.key(), b.key());
  b = a;
  b.bf16_layers = {0};
  EXPECT_NE(a.key(), b.key());
  EXPECT_EQ(a.key(), fp8->key());

  KvLayout base;
  base.num_layers = 8;
  base.k_dim = base.v_dim = 64;
  const KvLayout layout = apply_kv_layout(*fp8, *spec, base);
  EXPECT_EQ(layout.layer_dtype(0), DType::kBF16);
  EXPECT_EQ(layout.layer_dtype(1), DType::kFP8E4M3);
  EXPECT_EQ(layout.rope_dim, 0);
}

TEST(KvConfig, ResolvesMlaOptions) {
  auto spec = load_model_spec(model_dir("house-mla"));
  ASSERT_TRUE(spec.ok());
  auto flash =
      resolve_kv_cache_config({.dtype = KvCacheDtype::kFp8FlashMla}, *spec, nullptr, DType::kF32);
  ASSERT_TRUE(flash.ok()) << flash.status().to_string();
  EXPECT_EQ(flash->format, KvFormat::kFlashMlaFp8);
  EXPECT_EQ(flash->dtype, DType::kFP8E4M3);
  auto rope =
      resolve_kv_cache_config({.dtype = KvCacheDtype::kFp8E4M3, .mla_rope_dtype = DType::kBF16},
                              *spec, nullptr, DType::kF32);
  ASSERT_TRUE(rope.ok());
  ASSERT_TRUE(rope->mla_rope_dtype.has_value());
  KvLayout base;
  base.num_layers = spec->num_layers;
  base.k_dim = 160;
  const KvLayout layout = apply_kv_layout(*rope, *spec, base);
  EXPECT_EQ(layout.rope_dim, 32);
  EXPECT_EQ(layout.k_row_bytes(0), 128 + 32 * 2);
  EXPECT_FALSE(resolve_kv_cache_config(
                   {.dtype = KvCacheDtype::kFp8FlashMla, .mla_rope_dtype = DType::kFP8E4M3}, *spec,
                   nullptr, DType::kF32)
                   .ok());
}

TEST(KvConfig, ParsesLayerLists) {
  auto ok = parse_layer_list("0,7,3", "--kv-bf16-layers");
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(*ok, (std::vector<int>{0, 7, 3}));
  EXPECT_TRUE(parse_layer_list("", "--x")->empty());
  EXPECT_FALSE(parse_layer_list("1,a", "--x").ok());
  EXPECT_FALSE(parse_layer_list("-1", "--x").ok());
  EXPECT_FALSE(parse_layer_list("2x", "--x").ok());
}

}  // namespace
}  // namespace strata
