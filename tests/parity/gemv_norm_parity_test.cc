// An RMSNorm inside the decode GEMV that reads its output (backend/cuda/norm_prologue.cuh; MLA's
// q_a norm before q_b, arch/deepseek.cc). Graph mode merges the two when
// CudaTunables::gemv_norm_fusion is on; the GEMV's blocks follow the norm kernel's order of sums,
// so the bound is equality with the eager run's separate launches, bit for bit, for the GEMV's
// output and the norm's (block 0 stores it), and the step records one launch fewer. Shapes: a
// Kimi-K2.5 rank's and DeepSeek-V3's q_b (1536 -> 8 / 128 heads x 192), k past one pass of the
// block's warps (4096, 7168), bf16 and f32 norm weights, odd rows with a bias, m = 1 and 2, a
// SwiGLU GEMV. Not merged, and still the eager bits: the norm in place, k of the warp kernel
// (256), an add_rms_norm (a Kimi rank's q_a + kv_a pair after the input norm, the 8B shape's
// SwiGLU gate_up: their residual update stays in the norm's launch), the tunable off.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "parity/op_pair.h"

namespace strata::parity {
namespace {

struct NormCase {
  const char* name;
  int64_t k, n;
  bool f32_weight, bias, in_place, merges;  // merges: when the tunable is on
  bool residual = false;                    // add_rms_norm (residual += x first)
  int64_t pair_n = 0;                       // a second GEMV on the norm's output (0: none)
  bool glu = false;                         // the GEMV is linear_silu_mul (n = 2 * inter)
};

TEST(GemvNorm, GraphModeRunsTheNormInsideTheGemv) {
  Pair p;
  auto& gpu = p.cuda();
  const cuda::CudaTunables defaults = gpu.tunables();
  ASSERT_TRUE(defaults.fusion);
  const NormCase cases[] = {
      {"kimi rank q_b", 1536, 1536, false, false, false, true},
      {"v3 q_b", 1536, 24576, false, false, false, true},
      {"k 4096, f32 norm weight", 4096, 512, true, false, false, true},
      {"k 7168, odd rows, bias", 7168, 333, false, true, false, true},
      {"in place", 1536, 1536, false, false, true, false},
      {"warp norm (k 256)", 256, 512, false, false, false, false},
      {"add: kimi rank q_a + kv_a", 7168, 1536, false, false, false, false, true, 576},
      {"add: 8B gate_up (SwiGLU)", 4096, 2 * 1024, true, false, false, false, true, 0, true},
      {"SwiGLU, f32 norm weight", 2048, 2 * 1408, true, false, false, true, false, 0, true},
  };
  for (const NormCase& c : cases) {
    auto weight = [&](int64_t n) {
      LinearWeight w;
      auto wv = p.random(n * c.k, 0.03f);
      w.weight = gpu.upload(Tensor::make(wv.data(), DType::kF32, {n, c.k}), DType::kBF16);
      if (c.bias) {
        auto b = p.random(n, 0.1f);
        w.bias = gpu.upload(Tensor::make(b.data(), DType::kF32, {n}), DType::kF32);
      }
      return w;
    };
    const LinearWeight w = weight(c.n);
    const LinearWeight w2 = c.pair_n > 0 ? weight(c.pair_n) : LinearWeight{};
    auto norm_w = p.norm_weight(c.k, c.f32_weight);
    const int64_t out_n = c.glu ? c.n / 2 : c.n;
    for (int64_t m : {1, 2}) {
      auto x = gpu.alloc(DType::kBF16, {m, c.k});
      auto residual = gpu.alloc(DType::kBF16, {m, c.k});
      auto fill = [&](uint64_t seed) {
        gpu.fill_random(*x, seed, 1.0f);
        gpu.fill_random(*residual, seed + 100, 2.0f);
      };
      // As arch/deepseek.cc's q path or decoder.cc's norms: the norm, then the linear(s) on its
      // output; the outputs, the norm's output and the residual as floats.
      auto step = [&] {
        auto xn = c.in_place ? DeviceTensorPtr() : gpu.alloc(DType::kBF16, {m, c.k});
        const Tensor& normed = c.in_place ? x->view() : xn->view();
        auto o = gpu.alloc(DType::kBF16, {m, out_n});
        auto o2 = gpu.alloc(DType::kBF16, {m, std::max<int64_t>(c.pair_n, 1)});
        if (c.residual)
          gpu.add_rms_norm(*x, *residual, *norm_w, 1e-6f, normed);
        else
          gpu.rms_norm(*x, *norm_w, 1e-6f, normed);
        if (c.glu)
          gpu.linear_silu_mul(normed, w, *o);
        else
          gpu.linear(normed, w, *o);
        if (c.pair_n > 0) gpu.linear(normed, w2, *o2);
        std::vector<float> out(size_t(m * (out_n + c.pair_n + 2 * c.k)));
        float* at = out.data();
        gpu.download_f32(*o, at);  // ends the step (graph mode: capture or replay)
        at += m * out_n;
        if (c.pair_n > 0) gpu.download_f32(*o2, at);
        at += m * c.pair_n;
        gpu.download_f32(normed, at);
        gpu.download_f32(*residual, at + m * c.k);
        return out;
      };
      std::vector<std::vector<float>> eager;
      for (uint64_t seed : {1, 2}) {
        fill(seed);
        eager.push_back(step());
      }
      for (bool on : {true, false}) {
        gpu.tune([&](cuda::CudaTunables& t) { t.gemv_norm_fusion = on; });
        gpu.set_graph_mode(true);
        const cuda::GraphStats before = gpu.graph_stats();
        for (uint64_t seed : {1, 2, 1}) {
          fill(seed);
          const auto got = step();
          EXPECT_EQ(0, std::memcmp(got.data(), eager[seed - 1].data(), got.size() * 4))
              << c.name << " m " << m << " on " << on << " seed " << seed;
        }
        const cuda::GraphStats& after = gpu.graph_stats();
        EXPECT_EQ(after.replays - before.replays, 2) << c.name << " m " << m;
        // The pair's two GEMVs merge with or without the norm.
        const int64_t per_step = on && c.merges ? 1 : 2;
        EXPECT_EQ(after.launches - before.launches, 3 * per_step)
            << c.name << " m " << m << " on " << on;
        gpu.set_graph_mode(false);
      }
      gpu.set_tunables(defaults);
    }
    std::printf("gemv norm %-28s k %lld rows %lld, m 1 and 2: eager bits, %s\n", c.name,
                (long long)c.k, (long long)c.n,
                c.merges ? "one launch merged" : "separate launches");
  }
}

}  // namespace
}  // namespace strata::parity
