// An RMSNorm inside the decode GEMV that reads its output (backend/cuda/gemv_norm.cuh; MLA's q_a
// norm before q_b, arch/deepseek.cc). Graph mode merges the two when
// CudaTunables::gemv_norm_fusion is on; the GEMV's blocks follow the norm kernel's order of sums,
// so the bound is equality with the eager run's two launches, bit for bit, for both the GEMV's
// output and the norm's (block 0 stores it), and the step records one launch fewer. Shapes: a
// Kimi-K2.5 rank's and DeepSeek-V3's q_b (1536 -> 8 / 128 heads x 192), k past one pass of the
// block's warps (4096, 7168), bf16 and f32 norm weights, odd rows with a bias, m = 1 and 2. Not
// merged, and still the eager bits: the norm in place, k of the warp kernel (256), the tunable off.
#include <gtest/gtest.h>

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
  };
  for (const NormCase& c : cases) {
    LinearWeight w;
    auto wv = p.random(c.n * c.k, 0.03f);
    w.weight = gpu.upload(Tensor::make(wv.data(), DType::kF32, {c.n, c.k}), DType::kBF16);
    if (c.bias) {
      auto b = p.random(c.n, 0.1f);
      w.bias = gpu.upload(Tensor::make(b.data(), DType::kF32, {c.n}), DType::kF32);
    }
    auto nv = p.random(c.k, 0.5f);
    for (float& v : nv) v += 1.0f;
    auto norm_w = gpu.upload(Tensor::make(nv.data(), DType::kF32, {c.k}),
                             c.f32_weight ? DType::kF32 : DType::kBF16);
    for (int64_t m : {1, 2}) {
      auto x = gpu.alloc(DType::kBF16, {m, c.k});
      auto step = [&] {  // as arch/deepseek.cc's q path: the norm, then the linear on its output
        auto xn = c.in_place ? DeviceTensorPtr() : gpu.alloc(DType::kBF16, {m, c.k});
        const Tensor& normed = c.in_place ? x->view() : xn->view();
        auto o = gpu.alloc(DType::kBF16, {m, c.n});
        gpu.rms_norm(*x, *norm_w, 1e-6f, normed);
        gpu.linear(normed, w, *o);
        std::vector<float> out(size_t(m * (c.n + c.k)));
        gpu.download_f32(*o, out.data());  // ends the step (graph mode: capture or replay)
        gpu.download_f32(normed, out.data() + m * c.n);
        return out;
      };
      std::vector<std::vector<float>> eager;
      for (uint64_t seed : {1, 2}) {
        gpu.fill_random(*x, seed, 1.0f);
        eager.push_back(step());
      }
      for (bool on : {true, false}) {
        gpu.tune([&](cuda::CudaTunables& t) { t.gemv_norm_fusion = on; });
        gpu.set_graph_mode(true);
        const cuda::GraphStats before = gpu.graph_stats();
        for (uint64_t seed : {1, 2, 1}) {
          gpu.fill_random(*x, seed, 1.0f);
          const auto got = step();
          EXPECT_EQ(0, std::memcmp(got.data(), eager[seed - 1].data(), got.size() * 4))
              << c.name << " m " << m << " on " << on << " seed " << seed;
        }
        const cuda::GraphStats& after = gpu.graph_stats();
        EXPECT_EQ(after.replays - before.replays, 2) << c.name << " m " << m;
        const int64_t per_step = on && c.merges ? 1 : 2;
        EXPECT_EQ(after.launches - before.launches, 3 * per_step)
            << c.name << " m " << m << " on " << on;
        gpu.set_graph_mode(false);
      }
      gpu.set_tunables(defaults);
    }
    std::printf("gemv norm %-26s k %lld rows %lld, m 1 and 2: eager bits, %s\n", c.name,
                (long long)c.k, (long long)c.n, c.merges ? "one launch merged" : "two launches");
  }
}

}  // namespace
}  // namespace strata::parity
