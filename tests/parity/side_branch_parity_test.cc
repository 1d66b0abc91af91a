// Side branches on the CUDA backend (backend/side_branch.h, backend/cuda/side_branch.cc): a MoE
// layer's shared experts (the SwiGLU GEMV, then the down GEMV) on a second stream beside the
// router, the route and the routed experts, joined right before moe_experts_add's combine.
// (arch/deepseek.cc records the router before the branch; here the branch comes first. Either
// order must give the one-stream bits; this one also has the logits allocated while the branch's
// freed block is deferred.) The same kernels run on the same inputs, so the bound is
// equality with the one-stream run, eager and replayed from captured graphs (whose fork and join
// are edges of the graph); a step with a branch records two launches more (the fork and the
// branch's end; the join rides in the experts' launch). The branch's SwiGLU output is made and
// freed inside it (the pool defers that block's reuse to the join). Routed experts in bf16 and
// INT4 group 32 (Kimi-K2.5's mix: bf16 shared experts); T = 1, 2, 3 and 40 with branches of up to
// 0 (the reference), 8 and 64 rows: T = 3 and 40 are above gemv_max_rows, so the branch's
// linears are cuBLAS GEMMs on the branch's own handle and workspace.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/side_branch.h"
#include "parity/moe_stack.h"
#include "parity/op_pair.h"

namespace strata::parity {
namespace {

LinearWeight bf16_weight(Pair& p, int64_t n, int64_t k) {
  LinearWeight w;
  auto v = p.random(n * k, 0.05f);
  w.weight = p.gpu_->upload(Tensor::make(v.data(), DType::kF32, {n, k}), DType::kBF16);
  return w;
}

TEST(SideBranch, SharedExpertsBesideTheRoutingGiveTheOneStreamBits) {
  Pair p;
  auto& gpu = p.cuda();
  SideBranches* side = side_branches(gpu);
  ASSERT_NE(side, nullptr);
  const cuda::CudaTunables defaults = gpu.tunables();
  ASSERT_TRUE(defaults.fusion);
  ASSERT_EQ(defaults.gemv_max_rows, 2);
  const int64_t hidden = 256, inter = 128, shared_inter = 256;
  const int experts = 32, k = 4;
  const MoeRouteArgs a{.num_experts = experts,
                       .top_k = k,
                       .num_groups = 1,
                       .topk_groups = 1,
                       .scoring = MoeScoring::kSigmoid,
                       .group_score = MoeGroupScore::kMax,
                       .normalize = true,
                       .scaling_factor = 2.5f};
  const LinearWeight gate = bf16_weight(p, experts, hidden);
  const LinearWeight shared_gate_up = bf16_weight(p, 2 * shared_inter, hidden);
  const LinearWeight shared_down = bf16_weight(p, hidden, shared_inter);
  for (Fmt f : {Fmt::kBf16, Fmt::kInt4g32}) {
    MoeExpertWeights ex;
    ex.gate_up = gpu.upload_linear(random_stack(p.rng(), f, experts, 2 * inter, hidden), Tensor{});
    ex.down = gpu.upload_linear(random_stack(p.rng(), f, experts, hidden, inter), Tensor{});
    for (int64_t t : {1, 2, 3, 40}) {
      auto x = gpu.alloc(DType::kBF16, {t, hidden}), out = gpu.alloc(DType::kBF16, {t, hidden});
      auto step = [&] {  // arch/deepseek.cc's moe_block, the branch before the router
        auto shared = gpu.alloc(DType::kBF16, {t, hidden});
        side->begin_side_branch(t);
        {
          // Made and freed inside the branch: the pool must not hand its block to the logits
          // below while the side stream may still read it (deferred releases).
          auto shared_act = gpu.alloc(DType::kBF16, {t, shared_inter});
          gpu.linear_silu_mul(*x, shared_gate_up, *shared_act);
          gpu.linear(*shared_act, shared_down, *shared);
        }
        side->end_side_branch();
        auto logits = gpu.alloc(DType::kF32, {t, experts});
        gpu.linear(*x, gate, *logits);
        auto ids = gpu.alloc(DType::kI32, {t, k}), w = gpu.alloc(DType::kF32, {t, k});
        gpu.moe_route(*logits, Tensor{}, a, *ids, *w);
        gpu.moe_experts_add(*x, ex, *ids, *w, *shared, *out);
        std::vector<float> o(static_cast<size_t>(t * hidden));
        gpu.download_f32(*out, o.data());  // ends the step (graph mode: capture or replay)
        return o;
      };
      // The one stream, eager: the reference bits.
      std::vector<std::vector<float>> want;
      for (uint64_t seed : {1, 2}) {
        gpu.fill_random(*x, seed, 1.0f);
        want.push_back(step());
      }
      int64_t one_stream_launches = 0;
      for (int max_rows : {0, 8, 64}) {
        gpu.tune([&](cuda::CudaTunables& tu) { tu.side_branch_max_rows = max_rows; });
        for (bool graphs : {false, true}) {
          gpu.set_graph_mode(graphs);
          const cuda::GraphStats before = gpu.graph_stats();
          for (uint64_t seed : {1, 2, 1}) {
            gpu.fill_random(*x, seed, 1.0f);
            EXPECT_EQ(step(), want[seed - 1])
                << fmt_name(f) << " T " << t << " max_rows " << max_rows << " graphs " << graphs
                << " seed " << seed;
          }
          if (graphs) {
            const cuda::GraphStats& after = gpu.graph_stats();
            EXPECT_EQ(after.captures - before.captures, 1) << fmt_name(f) << " T " << t;
            EXPECT_EQ(after.replays - before.replays, 2) << fmt_name(f) << " T " << t;
            const int64_t launches = (after.launches - before.launches) / 3;
            if (max_rows == 0)
              one_stream_launches = launches;
            else
              EXPECT_EQ(launches, one_stream_launches + (t <= max_rows ? 2 : 0))
                  << fmt_name(f) << " T " << t << ": the fork and the branch's end";
          }
          gpu.set_graph_mode(false);
        }
      }
      gpu.set_tunables(defaults);
      std::printf("side branch, %s experts, T %lld: eager and graphs give the one stream's bits\n",
                  fmt_name(f), (long long)t);
    }
  }
}

}  // namespace
}  // namespace strata::parity
