// Safetensors parsing and WeightStore: hand-written files in a temp dir, one corruption at a time.
#include "model/safetensors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "model/weights.h"
#include "support/temp_dir.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

using strata::testing::TempDir;

// Writes [u64 header_len][header][data]; `declared_len` overrides the length field.
void write_raw(const std::string& path, const std::string& header, const std::string& data,
               int64_t declared_len = -1) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  uint64_t n = declared_len >= 0 ? uint64_t(declared_len) : header.size();
  for (int i = 0; i < 8; ++i) out.put(char(n >> (8 * i)));
  out << header << data;
}

std::vector<uint8_t> bf16_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> out(v.size() * 2);
  for (size_t i = 0; i < v.size(); ++i) {
    uint16_t b = f32_to_bf16(v[i]);
    std::memcpy(out.data() + 2 * i, &b, 2);
  }
  return out;
}

std::string open_error(const std::string& path) {
  auto f = SafetensorsFile::open(path);
  EXPECT_FALSE(f.ok()) << path;
  return f.ok() ? "" : f.status().message();
}

TEST(SafetensorsTest, ReadsValidFile) {
  TempDir d;
  std::string header =
      R"({"__metadata__":{"format":"pt"},"b":{"dtype":"BF16","shape":[2],"data_offsets":[8,12]},)"
      R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  float a[2] = {1.5f, -2.0f};
  uint16_t b[2] = {f32_to_bf16(3.0f), f32_to_bf16(0.25f)};
  std::string data(reinterpret_cast<char*>(a), 8);
  data.append(reinterpret_cast<char*>(b), 4);
  write_raw(d.file("model.safetensors"), header, data);

  auto f = SafetensorsFile::open(d.file("model.safetensors"));
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  ASSERT_EQ((*f)->tensors().size(), 2u);
  EXPECT_EQ((*f)->tensors()[0].name, "a");  // sorted by offset
  EXPECT_EQ((*f)->metadata().at("format"), "pt");

  auto ws = WeightStore::open(d.str());
  ASSERT_TRUE(ws.ok()) << ws.status().to_string();
  EXPECT_EQ(ws->names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(ws->contains("a"));
  EXPECT_FALSE(ws->contains("c"));
  const TensorInfo* tb = ws->find("b");
  ASSERT_NE(tb, nullptr);
  EXPECT_EQ(tb->dtype, DType::kBF16);
  EXPECT_EQ(tb->shape, Shape{2});
  EXPECT_EQ(tb->nbytes, 4);
  auto lb = ws->load_f32("b", {2});
  ASSERT_TRUE(lb.ok());
  EXPECT_EQ(lb->f32()[0], 3.0f);
  EXPECT_EQ(lb->f32()[1], 0.25f);
  auto la = ws->load_f32("a");
  ASSERT_TRUE(la.ok());
  EXPECT_EQ(la->f32()[1], -2.0f);
}

TEST(SafetensorsTest, CorruptionsGiveNamedErrors) {
  TempDir d;
  const std::string p = d.file("model.safetensors");
  const std::string ok_entry = R"("w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]})";
  const std::string data16(16, '\0');

  write_raw(p, "", "", 0);
  std::filesystem::resize_file(p, 5);
  EXPECT_THAT(open_error(p), HasSubstr("too short"));

  write_raw(p, "{" + ok_entry + "}", data16, 4096);
  EXPECT_THAT(open_error(p), HasSubstr("header length 4096 exceeds the file size"));

  write_raw(p, "{" + ok_entry, data16);
  EXPECT_THAT(open_error(p), HasSubstr("not valid JSON"));

  write_raw(p, R"({"w":{"dtype":"Q4","shape":[2,2],"data_offsets":[0,16]}})", data16);
  EXPECT_THAT(open_error(p), HasSubstr("tensor 'w': unsupported dtype 'Q4'"));

  write_raw(p, R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,16]}})", data16);
  EXPECT_THAT(open_error(p), HasSubstr("tensor 'w': shape [2, 3] of F32 needs 24 bytes"));

  write_raw(p, R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[8,24]}})", data16);
  std::string e = open_error(p);
  EXPECT_THAT(e, HasSubstr("model.safetensors: tensor 'w': data_offsets [8, 24] exceed file size"));

  // Truncated file: the header is intact, the data is cut short.
  write_raw(p, "{" + ok_entry + "}", data16.substr(0, 10));
  EXPECT_THAT(open_error(p), HasSubstr("exceed file size"));

  write_raw(p,
            R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
            R"("y":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
            data16);
  EXPECT_THAT(open_error(p), HasSubstr("tensors 'x' and 'y' overlap"));

  write_raw(p, R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[16,0]}})", data16);
  EXPECT_THAT(open_error(p), HasSubstr("begin <= end"));

  write_raw(p, R"({"w":{"dtype":"F32","shape":[-2,2],"data_offsets":[0,16]}})", data16);
  EXPECT_THAT(open_error(p), HasSubstr("non-negative"));

  write_raw(p, R"({"w":{"dtype":"F32","data_offsets":[0,16]}})", data16);
  EXPECT_THAT(open_error(p), HasSubstr("tensor 'w': field 'shape' missing"));

  // Every error names the file.
  EXPECT_THAT(open_error(p), HasSubstr(p));
}

// The reference writer pads headers to 8 bytes; an unpadded one leaves data misaligned.
TEST(SafetensorsTest, MisalignedDataStillLoads) {
  TempDir d;
  std::string header = R"({"a":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]}})";
  if ((8 + header.size()) % 2 == 0) header += " ";
  uint16_t v[2] = {f32_to_bf16(1.5f), f32_to_bf16(-3.0f)};
  write_raw(d.file("model.safetensors"), header, std::string(reinterpret_cast<char*>(v), 4));
  auto ws = WeightStore::open(d.str());
  ASSERT_TRUE(ws.ok()) << ws.status().to_string();
  auto a = ws->load_f32("a", {2});
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->f32()[0], 1.5f);
  EXPECT_EQ(a->f32()[1], -3.0f);
}

TEST(WeightStoreTest, DirectoryErrorsAndShapeMismatch) {
  auto missing = WeightStore::open("/nonexistent/strata/dir");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("/nonexistent/strata/dir"));

  TempDir empty;
  auto none = WeightStore::open(empty.str());
  ASSERT_FALSE(none.ok());
  EXPECT_THAT(none.status().message(), HasSubstr("no model.safetensors"));

  TempDir d;
  ASSERT_TRUE(write_safetensors(
                  d.file("model.safetensors"),
                  {{.name = "model.layers.3.mlp.up_proj.weight",
                    .dtype = DType::kBF16,
                    .shape = {2, 3},
                    .bytes = bf16_bytes({1, 2, 3, 4, 5, 6})},
                   {.name = "ids", .dtype = DType::kI32, .shape = {1}, .bytes = {1, 0, 0, 0}}})
                  .ok());
  auto ws = WeightStore::open(d.str());
  ASSERT_TRUE(ws.ok()) << ws.status().to_string();
  auto bad = ws->load_f32("model.layers.3.mlp.up_proj.weight", {3, 2});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(),
              HasSubstr("model.safetensors: tensor 'model.layers.3.mlp.up_proj.weight': expected "
                        "shape [3, 2], found [2, 3]"));
  auto good = ws->load_f32("model.layers.3.mlp.up_proj.weight", {2, 3});
  ASSERT_TRUE(good.ok());
  EXPECT_EQ(good->f32()[5], 6.0f);
  auto absent = ws->load_f32("model.layers.3.mlp.down_proj.weight", {2, 3});
  ASSERT_FALSE(absent.ok());
  EXPECT_EQ(absent.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(absent.status().message(), HasSubstr("'model.layers.3.mlp.down_proj.weight'"));
  auto ints = ws->load_f32("ids");
  ASSERT_FALSE(ints.ok());
  EXPECT_THAT(ints.status().message(), HasSubstr("not a float weight"));
}

TEST(WeightStoreTest, ShardedIndex) {
  TempDir d;
  ASSERT_TRUE(write_safetensors(
                  d.file("model-00001-of-00002.safetensors"),
                  {{.name = "a", .dtype = DType::kBF16, .shape = {2}, .bytes = bf16_bytes({1, 2})}})
                  .ok());
  ASSERT_TRUE(write_safetensors(
                  d.file("model-00002-of-00002.safetensors"),
                  {{.name = "b", .dtype = DType::kBF16, .shape = {1}, .bytes = bf16_bytes({7})}})
                  .ok());
  auto write_index = [&](const std::string& body) {
    std::ofstream(d.file("model.safetensors.index.json")) << body;
  };
  write_index(R"({"metadata":{},"weight_map":{"a":"model-00001-of-00002.safetensors",
                 "b":"model-00002-of-00002.safetensors"}})");
  auto ws = WeightStore::open(d.str());
  ASSERT_TRUE(ws.ok()) << ws.status().to_string();
  EXPECT_EQ(ws->names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_THAT(ws->find("b")->file, HasSubstr("model-00002-of-00002.safetensors"));
  auto b = ws->load_f32("b", {1});
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->f32()[0], 7.0f);

  write_index(R"({"weight_map":{"a":"model-00001-of-00002.safetensors",
                 "c":"model-00003-of-00003.safetensors"}})");
  auto missing = WeightStore::open(d.str());
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(),
              HasSubstr("shard 'model-00003-of-00003.safetensors' is missing"));
  EXPECT_THAT(missing.status().message(), HasSubstr("model.safetensors.index.json"));

  write_index(R"({"weight_map":{"a":"model-00002-of-00002.safetensors"}})");
  auto wrong = WeightStore::open(d.str());
  ASSERT_FALSE(wrong.ok());
  EXPECT_THAT(wrong.status().message(), HasSubstr("tensor 'a' is mapped to shard"));

  write_index(R"({"weight_map": 3})");
  auto bad = WeightStore::open(d.str());
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("weight_map"));
}

}  // namespace
}  // namespace strata
