// A dense layer's add_rms_norm between two W4A16 decode GEMVs (o_proj -> norm -> qkv / gate_up,
// down -> norm -> the next qkv), which graph mode with CudaTunables::int4_add_norm_fusion splits:
// the residual update into the GEMV before (its epilogue), the norm into the GEMV after (its
// prologue, every block on the updated residual; backend/cuda/int4_norm_fusion.cc). Both follow
// the separate kernels' arithmetic, so the bound is equality with the eager run's three launches,
// bit for bit: the second GEMV's output, the norm's output (block 0 stores it), the residual and
// the first GEMV's output; and a step records two launches instead of three. Shapes: the 8B
// layer's o_proj -> qkv (group 128) and a SwiGLU gate_up, group 32 with a bias and an f32 norm
// weight, m = 1 and 2; m = 3 (the update merges, the norm stays a launch: the prologue takes
// m <= 2), a dim of the warp norm kernel (256: nothing merges), and the tunable off.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "core/dtype.h"
#include "core/weight_format.h"
#include "parity/op_pair.h"

namespace strata::parity {
namespace {

struct AddNormCase {
  const char* name;
  int64_t k_in, hidden, n2;  // first GEMV k_in -> hidden; second hidden -> n2 (SwiGLU: 2 · inter)
  int group;
  bool glu, bias, f32_norm, merges;  // merges: the norm's launch goes (m <= 2, tunable on)
};

// A random [out, in] INT4 weight (compressed-tensors pack-quantized: nibbles, bf16 scales).
HostLinearWeight random_int4(int64_t out, int64_t in, int group, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(0.5f, 1.5f);
  HostLinearWeight w;
  w.format = LinearFormat{.format = WeightFormat::kInt4Group, .group_size = group};
  w.out = out;
  w.in = in;
  w.values.resize(size_t(w.matrix_values_bytes()));
  w.scales.resize(size_t(w.matrix_scales_bytes()));
  for (uint8_t& b : w.values) b = uint8_t(rng());
  for (size_t i = 0; i < w.scales.size() / 2; ++i) {
    const uint16_t s = f32_to_bf16(0.01f * u(rng));
    std::memcpy(w.scales.data() + 2 * i, &s, 2);
  }
  return w;
}

TEST(Int4AddNorm, GraphModeSplitsTheNormBetweenTheGemvs) {
  Pair p;
  auto& gpu = p.cuda();
  const cuda::CudaTunables defaults = gpu.tunables();
  ASSERT_TRUE(defaults.fusion);
  const AddNormCase cases[] = {
      {"8B o_proj -> qkv", 4096, 4096, 6144, 128, false, false, false, true},
      {"8B-like down -> gate_up (SwiGLU)", 2048, 4096, 2 * 1024, 128, true, false, false, true},
      {"group 32, bias, f32 norm weight", 1024, 2048, 528, 32, false, true, true, true},
      {"warp norm (dim 256)", 512, 256, 256, 64, false, false, false, false},
  };
  std::mt19937 rng(45);
  for (const AddNormCase& c : cases) {
    std::vector<float> bias_v = p.random(c.hidden, 0.1f);
    const Tensor bias = c.bias ? Tensor::make(bias_v.data(), DType::kF32, {c.hidden}) : Tensor{};
    const LinearWeight w1 = gpu.upload_linear(random_int4(c.hidden, c.k_in, c.group, rng), bias);
    const LinearWeight w2 = gpu.upload_linear(random_int4(c.n2, c.hidden, c.group, rng), Tensor{});
    ASSERT_EQ(w1.format.format, WeightFormat::kInt4Group) << c.name << ": kept packed";
    auto norm_w = p.norm_weight(c.hidden, c.f32_norm);
    const int64_t out_n = c.glu ? c.n2 / 2 : c.n2;
    for (int64_t m : {1, 2, 3}) {
      auto a = gpu.alloc(DType::kBF16, {m, c.k_in});
      auto residual = gpu.alloc(DType::kBF16, {m, c.hidden});
      auto fill = [&](uint64_t seed) {
        gpu.fill_random(*a, seed, 1.0f);
        gpu.fill_random(*residual, seed + 100, 2.0f);
      };
      // As decoder.cc's layer: the first linear into branch, the add_rms_norm, the second linear
      // on its output; that output, h, the residual and branch as floats.
      auto step = [&] {
        auto branch = gpu.alloc(DType::kBF16, {m, c.hidden});
        auto h = gpu.alloc(DType::kBF16, {m, c.hidden});
        auto o = gpu.alloc(DType::kBF16, {m, out_n});
        gpu.linear(*a, w1, *branch);
        gpu.add_rms_norm(*branch, *residual, *norm_w, 1e-5f, *h);
        if (c.glu)
          gpu.linear_silu_mul(*h, w2, *o);
        else
          gpu.linear(*h, w2, *o);
        std::vector<float> out(size_t(m * (out_n + 3 * c.hidden)));
        float* at = out.data();
        gpu.download_f32(*o, at);  // ends the step (graph mode: capture or replay)
        gpu.download_f32(*h, at += m * out_n);
        gpu.download_f32(*residual, at += m * c.hidden);
        gpu.download_f32(*branch, at += m * c.hidden);
        return out;
      };
      const std::string what = std::string(c.name) + " m " + std::to_string(m);
      fill(1);
      for (float v : step()) ASSERT_TRUE(std::isfinite(v)) << what << ": eager reference";
      expect_merge_keeps_eager_bits(
          gpu, fill, step, [](cuda::CudaTunables& t, bool on) { t.int4_add_norm_fusion = on; },
          [&](bool on) { return on && c.merges && m <= 2 ? 2 : 3; }, what);
      gpu.set_tunables(defaults);
    }
    std::printf("int4 add norm %-34s %lld -> %lld -> %lld, group %d, m 1-3: eager bits, %s\n",
                c.name, (long long)c.k_in, (long long)c.hidden, (long long)c.n2, c.group,
                c.merges ? "two launches at m <= 2" : "three launches");
  }
}

}  // namespace
}  // namespace strata::parity
