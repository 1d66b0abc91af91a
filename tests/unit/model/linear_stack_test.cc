// WeightStore::load_linear_stack, the one-pass loader of sliced, fused and stacked linear weights,
// against the composition it replaces (load_linear + slice_linear_rows / slice_linear_cols +
// concat_linear_rows + stack_linears, core/weight_format.h): the same bytes and the same errors,
// for every stored format, on a checkpoint of random bytes written here. Dense slices are also
// checked element by element against the file's bytes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "model/safetensors.h"
#include "model/weights.h"
#include "support/temp_dir.h"

namespace strata {
namespace {

using ::testing::HasSubstr;

SafetensorsEntry random_entry(std::mt19937& rng, const std::string& name, DType dtype,
                              Shape shape) {
  SafetensorsEntry e{.name = name, .dtype = dtype, .shape = shape, .bytes = {}};
  e.bytes.resize(size_t(dtype_bytes_for(dtype, shape_numel(shape))));
  if (dtype == DType::kF32) {  // float32 scales: finite, positive
    std::uniform_real_distribution<float> u(1e-3f, 2e-3f);
    for (size_t i = 0; i < e.bytes.size(); i += 4) {
      const float v = u(rng);
      std::memcpy(&e.bytes[i], &v, 4);
    }
  } else {
    for (uint8_t& b : e.bytes) b = uint8_t(rng());
  }
  return e;
}

// dense [out, in] of `dtype`; fp8 [out, in] with 128x128 block scales; INT4 group 32 packed.
void add_linear(std::mt19937& rng, std::vector<SafetensorsEntry>& es, const std::string& name,
                const std::string& kind, int64_t out, int64_t in) {
  if (kind == "fp8") {
    es.push_back(random_entry(rng, name, DType::kFP8E4M3, {out, in}));
    es.push_back(
        random_entry(rng, name + "_scale_inv", DType::kF32, {(out + 127) / 128, (in + 127) / 128}));
  } else if (kind == "int4") {
    es.push_back(random_entry(rng, name + "_packed", DType::kI32, {out, in / 8}));
    es.push_back(random_entry(rng, name + "_scale", DType::kBF16, {out, in / 32}));
  } else {
    const DType dt = kind == "f16" ? DType::kF16 : kind == "f32" ? DType::kF32 : DType::kBF16;
    es.push_back(random_entry(rng, name, dt, {out, in}));
  }
}

class LinearStackTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::mt19937 rng(17);
    std::vector<SafetensorsEntry> es;
    for (int e = 0; e < 3; ++e) {
      const std::string x = "experts." + std::to_string(e) + ".";
      for (const char* kind : {"bf16", "fp8", "int4"}) {
        add_linear(rng, es, x + kind + ".gate.weight", kind, 256, 384);
        add_linear(rng, es, x + kind + ".up.weight", kind, 256, 384);
        add_linear(rng, es, x + kind + ".down.weight", kind, 384, 256);
      }
    }
    add_linear(rng, es, "q.weight", "bf16", 12, 16);
    add_linear(rng, es, "k.weight", "bf16", 8, 16);
    add_linear(rng, es, "v_f16.weight", "f16", 8, 16);
    add_linear(rng, es, "o_f32.weight", "f32", 16, 12);
    add_linear(rng, es, "odd_fp8.weight", "fp8", 200, 300);  // partial scale blocks
    add_linear(rng, es, "big.weight", "bf16", 2048, 1600);   // several copy tasks per slice
    ASSERT_TRUE(write_safetensors(dir_.file("model.safetensors"), es).ok());
    auto ws = WeightStore::open(dir_.str());
    ASSERT_TRUE(ws.ok()) << ws.status().to_string();
    ws_.emplace(std::move(*ws));
  }

  // The composed reference: each part loaded whole, sliced, the parts fused, the matrices stacked.
  StatusOr<HostLinearWeight> composed(const std::vector<std::vector<LinearRead>>& matrices,
                                      const std::string& what) const {
    std::vector<HostLinearWeight> stacked;
    for (const auto& parts : matrices) {
      std::vector<HostLinearWeight> ws;
      for (const LinearRead& r : parts) {
        STRATA_ASSIGN_OR_RETURN(HostLinearWeight w, ws_->load_linear(r.name, r.shape));
        if (r.row_end - r.row_begin != w.out) {
          STRATA_ASSIGN_OR_RETURN(w, slice_linear_rows(w, r.row_begin, r.row_end, r.name));
        }
        if (r.col_end - r.col_begin != w.in) {
          STRATA_ASSIGN_OR_RETURN(w, slice_linear_cols(w, r.col_begin, r.col_end, r.name));
        }
        ws.push_back(std::move(w));
      }
      STRATA_ASSIGN_OR_RETURN(HostLinearWeight fused,
                              concat_linear_rows(std::move(ws), parts[0].name));
      stacked.push_back(std::move(fused));
    }
    if (stacked.size() == 1) return std::move(stacked[0]);
    return stack_linears(std::move(stacked), what);
  }

  void expect_same(const std::vector<std::vector<LinearRead>>& matrices,
                   const std::string& label) const {
    auto got = ws_->load_linear_stack(matrices, "stack");
    auto want = composed(matrices, "stack");
    ASSERT_TRUE(want.ok()) << label << ": " << want.status().to_string();
    ASSERT_TRUE(got.ok()) << label << ": " << got.status().to_string();
    EXPECT_EQ(got->format, want->format) << label;
    EXPECT_EQ(got->stack, want->stack) << label;
    EXPECT_EQ(got->out, want->out) << label;
    EXPECT_EQ(got->in, want->in) << label;
    EXPECT_TRUE(got->values == want->values) << label << ": values differ";
    EXPECT_TRUE(got->scales == want->scales) << label << ": scales differ";
  }

  static LinearRead slice(const std::string& name, Shape shape, int64_t r0, int64_t r1, int64_t c0,
                          int64_t c1) {
    return LinearRead{.name = name,
                      .shape = shape,
                      .row_begin = r0,
                      .row_end = r1,
                      .col_begin = c0,
                      .col_end = c1};
  }

  testing::TempDir dir_;
  std::optional<WeightStore> ws_;
};

TEST_F(LinearStackTest, WholeAndSlicedWeightsMatchTheComposedPath) {
  for (const char* kind : {"bf16", "fp8", "int4"}) {
    const std::string gate = std::string("experts.1.") + kind + ".gate.weight";
    const std::string down = std::string("experts.1.") + kind + ".down.weight";
    expect_same({{LinearRead::whole(gate, {256, 384})}}, std::string(kind) + " whole");
    expect_same({{slice(gate, {256, 384}, 128, 256, 0, 384)}}, std::string(kind) + " rows");
    expect_same({{slice(down, {384, 256}, 0, 384, 128, 256)}}, std::string(kind) + " cols");
    expect_same({{slice(down, {384, 256}, 128, 384, 0, 128)}},
                std::string(kind) + " rows and cols");
  }
  expect_same({{slice("odd_fp8.weight", {200, 300}, 128, 200, 256, 300)}}, "fp8 partial blocks");
  expect_same({{LinearRead::whole("o_f32.weight", {16, 12})}}, "f32");
  expect_same({{slice("big.weight", {2048, 1600}, 0, 2048, 800, 1600)}}, "big cols");
  expect_same({{LinearRead::whole("big.weight", {2048, 1600})}}, "big whole");
}

TEST_F(LinearStackTest, FusedAndStackedExpertsMatchTheComposedPath) {
  for (const char* kind : {"bf16", "fp8", "int4"}) {
    // A tensor-parallel rank's experts: gate and up rows [128, 256) fused, down columns [128, 256).
    std::vector<std::vector<LinearRead>> gate_up, down;
    for (int e = 0; e < 3; ++e) {
      const std::string x = "experts." + std::to_string(e) + "." + kind;
      gate_up.push_back({slice(x + ".gate.weight", {256, 384}, 128, 256, 0, 384),
                         slice(x + ".up.weight", {256, 384}, 128, 256, 0, 384)});
      down.push_back({slice(x + ".down.weight", {384, 256}, 0, 384, 128, 256)});
    }
    expect_same(gate_up, std::string(kind) + " gate_up stack");
    expect_same(down, std::string(kind) + " down stack");
    expect_same({gate_up[2]}, std::string(kind) + " one fused");
  }
  expect_same({{LinearRead::whole("q.weight", {12, 16}), slice("k.weight", {8, 16}, 4, 8, 0, 16)}},
              "qkv");
}

TEST_F(LinearStackTest, DenseSlicesAreTheFilesBytes) {
  auto one =
      ws_->load_linear_stack({{slice("big.weight", {2048, 1600}, 1000, 1010, 333, 1555)}}, "x");
  ASSERT_TRUE(one.ok()) << one.status().to_string();
  const TensorInfo* t = ws_->find("big.weight");
  ASSERT_EQ(one->values.size(), size_t(10 * (1555 - 333) * 2));
  for (int64_t r = 0; r < 10; ++r)
    for (int64_t c = 0; c < 1555 - 333; ++c)
      ASSERT_EQ(std::memcmp(one->values.data() + (r * (1555 - 333) + c) * 2,
                            t->data + ((1000 + r) * 1600 + 333 + c) * 2, 2),
                0)
          << r << "," << c;
}

TEST_F(LinearStackTest, MixedDenseDtypesAreWidenedAsConcatDoes) {
  expect_same(
      {{LinearRead::whole("k.weight", {8, 16}), LinearRead::whole("v_f16.weight", {8, 16})}},
      "bf16 + f16");
  auto w = ws_->load_linear_stack(
      {{LinearRead::whole("k.weight", {8, 16}), LinearRead::whole("v_f16.weight", {8, 16})}}, "kv");
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(w->format.dense_dtype, DType::kF32);
}

TEST_F(LinearStackTest, ErrorsAreTheComposedPathsErrors) {
  const std::vector<std::vector<std::vector<LinearRead>>> bad = {
      {{slice("experts.0.fp8.gate.weight", {256, 384}, 64, 192, 0, 384)}},  // off the fp8 blocks
      {{slice("experts.0.int4.down.weight", {384, 256}, 0, 384, 16, 64)}},  // off the INT4 groups
      {{LinearRead::whole("experts.0.int4.gate.weight", {256, 385})}},      // wrong shape
      {{LinearRead::whole("nothing.weight", {4, 4})}},                      // missing
      {{LinearRead::whole("experts.0.int4.gate.weight", {256, 384}),        // formats differ
        LinearRead::whole("experts.0.bf16.up.weight", {256, 384})}},
      {{slice("experts.0.fp8.gate.weight", {256, 384}, 0, 100, 0, 384)}},  // fp8 rows off a block
      {{LinearRead::whole("odd_fp8.weight", {200, 300}),  // fp8 part straddles a block
        LinearRead::whole("odd_fp8.weight", {200, 300})}},
      {{LinearRead::whole("q.weight", {12, 16}),
        LinearRead::whole("o_f32.weight", {16, 12})}},                 // widths differ
      {{LinearRead::whole("experts.0.bf16.gate.weight", {256, 384})},  // stacked matrices differ
       {slice("experts.1.bf16.gate.weight", {256, 384}, 0, 128, 0, 384)}},
  };
  for (size_t i = 0; i < bad.size(); ++i) {
    auto got = ws_->load_linear_stack(bad[i], "stack");
    auto want = composed(bad[i], "stack");
    ASSERT_FALSE(want.ok()) << "case " << i;
    ASSERT_FALSE(got.ok()) << "case " << i;
    EXPECT_EQ(got.status().to_string(), want.status().to_string()) << "case " << i;
  }
  auto misaligned = ws_->load_linear_stack(
      {{slice("experts.2.int4.down.weight", {384, 256}, 0, 384, 16, 64)}}, "s");
  EXPECT_THAT(misaligned.status().message(), HasSubstr("experts.2.int4.down.weight"));
}

TEST_F(LinearStackTest, BuffersAreRecycled) {
  // The second load of the same shape reuses the first's memory once that weight is gone.
  const LinearRead r = LinearRead::whole("big.weight", {2048, 1600});
  const uint8_t* first = nullptr;
  {
    auto a = ws_->load_linear_stack({{r}}, "big");
    ASSERT_TRUE(a.ok());
    first = a->values.data();
  }
  auto b = ws_->load_linear_stack({{r}}, "big");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->values.data(), first);
}

}  // namespace
}  // namespace strata
