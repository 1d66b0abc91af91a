// The next layer's add_rms_norm inside the MoE combine (backend/cuda/moe_combine.cu; at tp 1
// arch/decoder.cc records it right after the MoE layer's experts). Graph mode merges the two when
// CudaTunables::moe_combine_norm_fusion is on; the fused combine follows the norm kernel's layout
// and order of sums, so the bound is equality with the eager run's two launches, bit for bit, for
// all three outputs (the combine's rows, the updated residual, the normalized rows), and the step
// records one launch fewer. Moonlight's and DeepSeek-V3's hidden sizes (2048, 7168: 256 and 896
// threads a token), bf16 and INT4 group-32 experts, bf16 and f32 norm weights, with the shared
// experts' rows added or not, T = 1, 2, 9 (decode) and 40 (the prefill regime: rows through the
// plan's pos). The merged kernel runs twice: with each token's row over a cluster of CTAs
// where its row has 16 warps or more (CudaTunables::moe_combine_cluster_max_tokens 64: at hidden
// 7168 7 CTAs a token at T = 1, 2 and 9, 2 at T = 40) and one CTA a token.
// Not merged, and still the eager bits: hidden 256 (the warp norm kernel).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/solo_comm.h"
#include "parity/moe_stack.h"
#include "parity/op_pair.h"

namespace strata::parity {
namespace {

struct CombineCase {
  int64_t hidden;
  Fmt format;
  bool f32_norm_weight, shared, merges;
};

TEST(MoeCombineNorm, GraphModeRunsTheNextNormInsideTheCombine) {
  Pair p;
  auto& gpu = p.cuda();
  const cuda::CudaTunables defaults = gpu.tunables();
  ASSERT_TRUE(defaults.fusion);
  const int experts = 16, k = 4;
  const int64_t inter = 64;
  const MoeRouteArgs a = softmax_route(experts, k);
  const CombineCase cases[] = {
      {2048, Fmt::kBf16, false, true, true},  {2048, Fmt::kInt4g32, true, false, true},
      {7168, Fmt::kBf16, false, false, true}, {7168, Fmt::kInt4g32, false, true, true},
      {256, Fmt::kBf16, false, true, false},
  };
  for (const CombineCase& c : cases) {
    MoeExpertWeights ex;
    ex.gate_up =
        gpu.upload_linear(random_stack(p.rng(), c.format, experts, 2 * inter, c.hidden), Tensor{});
    ex.down =
        gpu.upload_linear(random_stack(p.rng(), c.format, experts, c.hidden, inter), Tensor{});
    LinearWeight gate;
    auto gv = p.random(experts * c.hidden, 0.05f);
    gate.weight =
        gpu.upload(Tensor::make(gv.data(), DType::kF32, {experts, c.hidden}), DType::kBF16);
    auto norm_w = p.norm_weight(c.hidden, c.f32_norm_weight);
    for (int64_t t : {1, 2, 9, 40}) {
      auto x = gpu.alloc(DType::kBF16, {t, c.hidden}),
           shared = gpu.alloc(DType::kBF16, {t, c.hidden});
      auto residual = gpu.alloc(DType::kBF16, {t, c.hidden});
      auto step = [&](uint64_t seed) {  // as arch/decoder.cc: the MoE block, then the next norm
        gpu.fill_random(*x, seed, 1.0f);
        gpu.fill_random(*shared, seed + 10, 0.5f);
        gpu.fill_random(*residual, seed + 20, 1.0f);
        auto logits = gpu.alloc(DType::kF32, {t, experts});
        gpu.linear(*x, gate, *logits);
        auto ids = gpu.alloc(DType::kI32, {t, k}), w = gpu.alloc(DType::kF32, {t, k});
        gpu.moe_route(*logits, Tensor{}, a, *ids, *w);
        auto out = gpu.alloc(DType::kBF16, {t, c.hidden}),
             h = gpu.alloc(DType::kBF16, {t, c.hidden});
        if (c.shared) {
          gpu.moe_experts_add(*x, ex, *ids, *w, *shared, *out);
        } else {
          gpu.moe_experts(*x, ex, *ids, *w, *out);
        }
        gpu.add_rms_norm(*out, *residual, *norm_w, 1e-6f, *h);
        std::vector<float> o(size_t(3 * t * c.hidden));
        gpu.download_f32(*out, o.data());  // ends the step (graph mode: capture or replay)
        gpu.download_f32(*residual, o.data() + t * c.hidden);
        gpu.download_f32(*h, o.data() + 2 * t * c.hidden);
        return o;
      };
      const std::vector<std::vector<float>> eager = {step(1), step(2)};
      int64_t merged_launches = 0;
      // The merged kernel with each token's row over a cluster of CTAs (where T is small) and
      // one CTA a token, then unmerged.
      for (int pass = 0; pass < 3; ++pass) {
        const bool on = pass < 2;
        gpu.tune([&](cuda::CudaTunables& tu) {
          tu.moe_combine_norm_fusion = on;
          tu.moe_combine_cluster_max_tokens = pass == 0 ? 64 : 0;
        });
        gpu.set_graph_mode(true);
        const cuda::GraphStats before = gpu.graph_stats();
        for (uint64_t seed : {1, 2, 1}) {
          const auto got = step(seed);
          EXPECT_EQ(0, std::memcmp(got.data(), eager[seed - 1].data(), got.size() * 4))
              << "hidden " << c.hidden << " " << fmt_name(c.format) << " T " << t << " pass "
              << pass << " seed " << seed;
        }
        const cuda::GraphStats& after = gpu.graph_stats();
        EXPECT_EQ(after.replays - before.replays, 2) << "hidden " << c.hidden << " T " << t;
        // A merged step has one launch fewer than the same step unmerged (measured in the pass
        // with the tunable off, which runs second).
        if (on) {
          merged_launches = after.launches - before.launches;
        } else {
          EXPECT_EQ(after.launches - before.launches - merged_launches, c.merges ? 3 : 0)
              << "hidden " << c.hidden << " " << fmt_name(c.format) << " T " << t;
        }
        gpu.set_graph_mode(false);
      }
      gpu.set_tunables(defaults);
    }
    std::printf("moe combine + norm, hidden %lld, %s experts, %s norm weight%s: eager bits, %s\n",
                (long long)c.hidden, fmt_name(c.format), c.f32_norm_weight ? "f32" : "bf16",
                c.shared ? ", shared experts added" : "",
                c.merges ? "one launch merged" : "not merged");
  }
}

// One rank of a tensor-parallel group run alone (backend/solo_comm.h): the MoE output's skipped
// all-reduce stands between the combine and the next norm, so graph mode must not merge them (a
// real rank's norm reads the all-reduced sum): the step records what the unmerged step records,
// plus the collective's place (one launch that runs nothing), and gives the eager bits.
TEST(MoeCombineNorm, ASkippedAllReduceKeepsTheCombineAndTheNormApart) {
  Pair p;
  auto& gpu = p.cuda();
  const cuda::CudaTunables defaults = gpu.tunables();
  ASSERT_TRUE(defaults.fusion && defaults.moe_combine_norm_fusion);
  const int experts = 16, k = 4;
  const int64_t hidden = 7168, inter = 64, t = 1;
  const MoeRouteArgs a = softmax_route(experts, k);
  MoeExpertWeights ex;
  ex.gate_up =
      gpu.upload_linear(random_stack(p.rng(), Fmt::kInt4g32, experts, 2 * inter, hidden), Tensor{});
  ex.down =
      gpu.upload_linear(random_stack(p.rng(), Fmt::kInt4g32, experts, hidden, inter), Tensor{});
  LinearWeight gate;
  auto gv = p.random(experts * hidden, 0.05f);
  gate.weight = gpu.upload(Tensor::make(gv.data(), DType::kF32, {experts, hidden}), DType::kBF16);
  auto nv = p.random(hidden, 0.5f);
  auto norm_w = gpu.upload(Tensor::make(nv.data(), DType::kF32, {hidden}), DType::kBF16);
  auto x = gpu.alloc(DType::kBF16, {t, hidden}), shared = gpu.alloc(DType::kBF16, {t, hidden});
  auto residual = gpu.alloc(DType::kBF16, {t, hidden});
  const std::unique_ptr<Communicator> comm = make_solo_comm(8, gpu);
  auto step = [&](bool all_reduce) {
    gpu.fill_random(*x, 1, 1.0f);
    gpu.fill_random(*shared, 11, 0.5f);
    gpu.fill_random(*residual, 21, 1.0f);
    auto logits = gpu.alloc(DType::kF32, {t, experts});
    gpu.linear(*x, gate, *logits);
    auto ids = gpu.alloc(DType::kI32, {t, k}), w = gpu.alloc(DType::kF32, {t, k});
    gpu.moe_route(*logits, Tensor{}, a, *ids, *w);
    auto out = gpu.alloc(DType::kBF16, {t, hidden}), h = gpu.alloc(DType::kBF16, {t, hidden});
    gpu.moe_experts_add(*x, ex, *ids, *w, *shared, *out);
    if (all_reduce) comm->all_reduce_sum(*out);
    gpu.add_rms_norm(*out, *residual, *norm_w, 1e-6f, *h);
    std::vector<float> o(size_t(2 * t * hidden));
    gpu.download_f32(*residual, o.data());  // ends the step (graph mode: capture or replay)
    gpu.download_f32(*h, o.data() + t * hidden);
    return o;
  };
  const std::vector<float> eager = step(false);
  // Launches of one replayed step: fusion on with the skipped all-reduce, then off without it.
  int64_t launches[2] = {0, 0};
  for (int pass = 0; pass < 2; ++pass) {
    gpu.tune([&](cuda::CudaTunables& tu) { tu.moe_combine_norm_fusion = pass == 0; });
    gpu.set_graph_mode(true);
    (void)step(pass == 0);  // captures
    const cuda::GraphStats before = gpu.graph_stats();
    const auto got = step(pass == 0);
    EXPECT_EQ(gpu.graph_stats().replays - before.replays, 1) << "pass " << pass;
    launches[pass] = gpu.graph_stats().launches - before.launches;
    EXPECT_EQ(0, std::memcmp(got.data(), eager.data(), got.size() * 4)) << "pass " << pass;
    gpu.set_graph_mode(false);
  }
  gpu.set_tunables(defaults);
  EXPECT_EQ(launches[0], launches[1] + 1)
      << "the combine and the norm merged across the all-reduce";
  std::printf("skipped all-reduce: %lld launches a step (unmerged without it: %lld)\n",
              static_cast<long long>(launches[0]), static_cast<long long>(launches[1]));
}

}  // namespace
}  // namespace strata::parity
