// INT4 experts at one token with the down projection and the combine in one launch
// (backend/cuda/moe_experts_int4_down_combine.cu; CudaTunables::moe_int4_down_combine): the
// kernel follows the flat down projection's arithmetic and the combine's order of sums, so the
// bound is equality with the two launches, bit for bit, in eager and graph mode (where the step
// launches one kernel fewer: GraphStats::kernels). Kimi-K2.5's rank shape (hidden 7168, slice 256,
// top-8, group 32) and smaller slices (128, 64), group 128, top-6, with the shared experts' rows
// added or not.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "parity/moe_stack.h"
#include "parity/op_pair.h"

namespace strata::parity {
namespace {

struct DownCombineCase {
  int64_t hidden, inter;
  int top_k;
  Fmt format;
  bool shared;
};

TEST(MoeDownCombine, OneLaunchGivesTheDownAndCombineBits) {
  Pair p;
  auto& gpu = p.cuda();
  const cuda::CudaTunables defaults = gpu.tunables();
  const int experts = 16;
  const DownCombineCase cases[] = {
      {7168, 256, 8, Fmt::kInt4g32, true},  {7168, 256, 8, Fmt::kInt4g128, false},
      {2048, 128, 6, Fmt::kInt4g32, true},  {1024, 64, 8, Fmt::kInt4g32, false},
      {4096, 256, 4, Fmt::kInt4g128, true},
  };
  for (const DownCombineCase& c : cases) {
    const MoeRouteArgs a = softmax_route(experts, c.top_k);
    MoeExpertWeights ex;
    ex.gate_up = gpu.upload_linear(random_stack(p.rng(), c.format, experts, 2 * c.inter, c.hidden),
                                   Tensor{});
    ex.down =
        gpu.upload_linear(random_stack(p.rng(), c.format, experts, c.hidden, c.inter), Tensor{});
    LinearWeight gate;
    auto gv = p.random(experts * c.hidden, 0.05f);
    gate.weight =
        gpu.upload(Tensor::make(gv.data(), DType::kF32, {experts, c.hidden}), DType::kBF16);
    auto x = gpu.alloc(DType::kBF16, {1, c.hidden}),
         shared = gpu.alloc(DType::kBF16, {1, c.hidden});
    auto step = [&](uint64_t seed) {
      gpu.fill_random(*x, seed, 1.0f);
      gpu.fill_random(*shared, seed + 10, 0.5f);
      auto logits = gpu.alloc(DType::kF32, {1, experts});
      gpu.linear(*x, gate, *logits);
      auto ids = gpu.alloc(DType::kI32, {1, c.top_k}), w = gpu.alloc(DType::kF32, {1, c.top_k});
      gpu.moe_route(*logits, Tensor{}, a, *ids, *w);
      auto out = gpu.alloc(DType::kBF16, {1, c.hidden});
      if (c.shared)
        gpu.moe_experts_add(*x, ex, *ids, *w, *shared, *out);
      else
        gpu.moe_experts(*x, ex, *ids, *w, *out);
      std::vector<float> o(size_t(c.hidden));
      gpu.download_f32(*out, o.data());  // ends the step (graph mode: capture or replay)
      return o;
    };
    // Two launches (the default), then one: eager, then graph mode (capture, replay).
    int64_t kernels[2] = {0, 0};
    for (int on = 0; on < 2; ++on) {
      gpu.tune([&](cuda::CudaTunables& t) { t.moe_int4_down_combine = on == 1; });
      const std::vector<float> eager = step(1);
      if (on == 0) {
        gpu.tune([&](cuda::CudaTunables& t) { t.moe_int4_down_combine = true; });
        const std::vector<float> fused = step(1);
        EXPECT_EQ(0, std::memcmp(fused.data(), eager.data(), eager.size() * 4))
            << "hidden " << c.hidden << " inter " << c.inter << " " << fmt_name(c.format) << " top-"
            << c.top_k << (c.shared ? " shared" : "");
        gpu.tune([&](cuda::CudaTunables& t) { t.moe_int4_down_combine = false; });
      }
      gpu.set_graph_mode(true);
      (void)step(2);  // captures
      const cuda::GraphStats before = gpu.graph_stats();
      const std::vector<float> replayed = step(1);
      kernels[on] = gpu.graph_stats().kernels - before.kernels;
      EXPECT_EQ(gpu.graph_stats().replays - before.replays, 1);
      gpu.set_graph_mode(false);
      EXPECT_EQ(0, std::memcmp(replayed.data(), eager.data(), eager.size() * 4))
          << "graph mode, on " << on << ", hidden " << c.hidden << " inter " << c.inter;
    }
    gpu.set_tunables(defaults);
    EXPECT_EQ(kernels[0], kernels[1] + 1) << "hidden " << c.hidden << " inter " << c.inter;
    std::printf(
        "down + combine, hidden %lld, slice %lld, %s, top-%d%s: the two launches' bits, "
        "%lld kernels a step against %lld\n",
        static_cast<long long>(c.hidden), static_cast<long long>(c.inter), fmt_name(c.format),
        c.top_k, c.shared ? ", shared experts added" : "", static_cast<long long>(kernels[1]),
        static_cast<long long>(kernels[0]));
  }
}

}  // namespace
}  // namespace strata::parity
