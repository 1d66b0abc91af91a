// The MoE router GEMV and the expert choice as one launch (backend/cuda/moe_route.h
// launch_moe_router_route, issue 24: one launch fewer per MoE layer at decode) against the two
// launches it replaces (launch_moe_router, then launch_moe_route on its logits), whose routing
// moe_route_parity_test.cc and moe_backend_parity_test.cc compare with the CPU twin.
//
// The fused launch runs the route kernel's own device code in the CTAs that complete the
// router's last row tiles (1 to 4 of them, by tokens), so the bound is equality: logits, ids and
// weights bitwise. Cases: the shapes of Kimi-K2.5 (384 experts, sigmoid + correction bias),
// DeepSeek-V3 (group-limited, top-2-sum group scores), DeepSeek-V2 (grouped softmax) and V2-Lite
// (softmax), 1,024 experts (fewer routing warps: their shared memory), one split (every CTA
// completes a tile), and gate rows in equal pairs (exact ties, which must break to the lower id
// alike) at T = 1, 8, 13, 32 (1, 1, 2 and 4 routing CTAs; 1,024 experts: 3 warps a CTA, 1, 3, 4,
// 4). The launch is repeated on other inputs and replayed from a CUDA graph: its tile counters and
// the two of the route must come back to zero each time.
//
// Through the CUDA backend: graph mode merges the router linear and moe_route of its logits
// into one launch up to CudaTunables::moe_router_route_max_tokens (the step records one launch
// fewer: GraphStats::launches) and gives the eager run's bits; above it, or with the merge off,
// the step keeps its two launches.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/moe_route.h"
#include "parity/moe_device.h"
#include "parity/op_pair.h"

namespace strata::parity {
namespace {

struct FusedCase {
  const char* name;
  int experts;
  int64_t hidden;
  int top_k, groups, topk_groups, scoring, group_score, normalize;
  bool bias;
  float scaling;
  bool paired_rows;  // gate rows 2i and 2i + 1 equal: exact ties
  int splits;        // 0: the launcher's choice
};
constexpr int kSig = cuda::kMoeSigmoid, kSoft = cuda::kMoeSoftmax;
constexpr int kTop2 = cuda::kMoeGroupTop2Sum, kMax = cuda::kMoeGroupMax;
const FusedCase kFusedCases[] = {
    {"kimi", 384, 7168, 8, 1, 1, kSig, kTop2, 1, true, 2.827f, false, 0},
    {"kimi paired rows", 384, 7168, 8, 1, 1, kSig, kTop2, 1, true, 2.827f, true, 0},
    {"kimi one split", 384, 7168, 8, 1, 1, kSig, kTop2, 1, true, 2.827f, false, 1},
    {"v3 grouped", 256, 7168, 8, 8, 4, kSig, kTop2, 1, true, 2.5f, false, 0},
    {"v2 grouped softmax", 160, 5120, 6, 8, 3, kSoft, kMax, 0, false, 16.0f, false, 0},
    {"v2-lite softmax", 64, 2048, 6, 1, 1, kSoft, kMax, 0, false, 1.0f, false, 0},
    {"1024 experts", 1024, 512, 8, 1, 1, kSig, kTop2, 1, true, 1.0f, false, 0},
};

// One routing's device outputs.
struct Routed {
  std::vector<float> logits, weights;
  std::vector<int32_t> ids;
};

TEST(MoeParity, RouterRouteOneLaunchIsBitwiseTheTwoLaunches) {
  Stream s;
  std::mt19937 rng(11);
  for (const FusedCase& c : kFusedCases) {
    const int e = c.experts, k = c.top_k;
    std::vector<float> w = random_bf16(rng, int64_t(e) * c.hidden, 0.02f);
    if (c.paired_rows)
      for (int r = 1; r < e; r += 2)
        std::memcpy(&w[size_t(r) * c.hidden], &w[size_t(r - 1) * c.hidden], c.hidden * 4);
    std::vector<float> bias(static_cast<size_t>(e));
    std::normal_distribution<float> nd(0.0f, 0.01f);
    for (float& b : bias) b = nd(rng);
    auto dw = upload(to_bits(w), s), db = upload(bias, s);
    for (int64_t t : {1, 8, 13, 32}) {
      std::vector<std::unique_ptr<Dev>> xs;
      for (int i = 0; i < 2; ++i)
        xs.push_back(upload(to_bits(random_bf16(rng, t * c.hidden, 1)), s));
      Dev logits(size_t(t * e) * 4), ids(size_t(t * k) * 4), wts(size_t(t * k) * 4);
      Dev partials(std::max<size_t>(16, cuda::moe_router_partials_bytes(t, e, c.hidden))),
          counters(cuda::moe_router_counter_bytes(e));
      CUDA_CHECK(cudaMemsetAsync(counters.as<void>(), 0, counters.bytes(), s.get()));
      auto params = [&](int xi) {
        cuda::MoeRouterRouteParams f{};
        f.router.x = xs[size_t(xi)]->as<bf16_bits>();
        f.router.w = dw->as<bf16_bits>();
        f.router.out = logits.as<float>();
        f.router.partials = partials.as<float>();
        f.router.counters = counters.as<int32_t>();
        f.router.tokens = t;
        f.router.experts = e;
        f.router.hidden = c.hidden;
        f.router.splits = c.splits;
        f.route.logits = logits.as<float>();
        f.route.bias = c.bias ? db->as<float>() : nullptr;
        f.route.topk_ids = ids.as<int32_t>();
        f.route.topk_weights = wts.as<float>();
        f.route.tokens = t;
        f.route.num_experts = e;
        f.route.top_k = k;
        f.route.num_groups = c.groups;
        f.route.topk_groups = c.topk_groups;
        f.route.scoring = c.scoring;
        f.route.group_score = c.group_score;
        f.route.normalize = c.normalize;
        f.route.scaling_factor = c.scaling;
        return f;
      };
      auto poison = [&] {
        for (Dev* d : {&logits, &ids, &wts})
          CUDA_CHECK(cudaMemsetAsync(d->as<void>(), 0xff, d->bytes(), s.get()));
      };
      auto read = [&] {
        return Routed{download<float>(logits, size_t(t * e), s),
                      download<float>(wts, size_t(t * k), s),
                      download<int32_t>(ids, size_t(t * k), s)};
      };
      auto two_launches = [&](int xi) {
        poison();
        const cuda::MoeRouterRouteParams f = params(xi);
        cuda::launch_moe_router(f.router, s.get());
        cuda::launch_moe_route(f.route, s.get());
        return read();
      };
      const Routed want[2] = {two_launches(0), two_launches(1)};
      auto expect_same = [&](const Routed& got, int xi, const char* how) {
        const Routed& r = want[xi];
        EXPECT_EQ(0, std::memcmp(got.logits.data(), r.logits.data(), r.logits.size() * 4))
            << c.name << " T " << t << " " << how << ": logits";
        EXPECT_EQ(got.ids, r.ids) << c.name << " T " << t << " " << how << ": ids";
        EXPECT_EQ(0, std::memcmp(got.weights.data(), r.weights.data(), r.weights.size() * 4))
            << c.name << " T " << t << " " << how << ": weights";
      };
      // Plain launches on alternating inputs (each must find its counters zero again).
      for (int xi : {0, 1, 0}) {
        poison();
        cuda::launch_moe_router_route(params(xi), s.get());
        expect_same(read(), xi, "launch");
      }
      // A captured graph of the launch, replayed twice.
      poison();
      cudaGraph_t g = nullptr;
      cudaGraphExec_t ge = nullptr;
      CUDA_CHECK(cudaStreamBeginCapture(s.get(), cudaStreamCaptureModeThreadLocal));
      cuda::launch_moe_router_route(params(1), s.get());
      CUDA_CHECK(cudaStreamEndCapture(s.get(), &g));
      CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
      for (int rep = 0; rep < 2; ++rep) {
        poison();
        CUDA_CHECK(cudaGraphLaunch(ge, s.get()));
        expect_same(read(), 1, "graph replay");
      }
      CUDA_CHECK(cudaGraphExecDestroy(ge));
      CUDA_CHECK(cudaGraphDestroy(g));
      const auto cnt = download<int32_t>(counters, counters.bytes() / 4, s);
      for (size_t i = 0; i < cnt.size(); ++i)
        EXPECT_EQ(cnt[i], 0) << c.name << " T " << t << " counter " << i << " left set";
      if (c.paired_rows) {  // the ties are real: pair members' logits equal
        int equal = 0;
        for (int64_t r = 0; r < t * e; r += 2)
          equal += want[0].logits[size_t(r)] == want[0].logits[size_t(r + 1)];
        EXPECT_EQ(equal, t * e / 2) << c.name;
      }
    }
    std::printf("router+route one launch %-20s T 1, 8, 13, 32: compared bitwise\n", c.name);
  }
}

// ---- through the backend ----
TEST(MoeBackend, GraphModeMergesRouterAndRoute) {
  Pair p;
  auto& gpu = p.cuda();
  struct Case {
    const char* name;
    int64_t hidden;
    MoeRouteArgs args;
    bool bias;
  };
  using S = MoeScoring;
  using G = MoeGroupScore;
  const Case cases[] = {
      {"kimi", 7168, {384, 8, 1, 1, S::kSigmoid, G::kTop2Sum, true, 2.827f}, true},
      {"v3 grouped", 7168, {256, 8, 8, 4, S::kSigmoid, G::kTop2Sum, true, 2.5f}, true},
      {"v2 grouped softmax", 5120, {160, 6, 8, 3, S::kSoftmax, G::kMax, false, 16.0f}, false},
      // The tiny fixtures' router: 8 experts are one row tile, fewer tiles than routing CTAs.
      {"tiny", 64, {8, 2, 1, 1, S::kSoftmax, G::kMax, false, 1.0f}, false},
  };
  const cuda::CudaTunables defaults = gpu.tunables();
  ASSERT_TRUE(defaults.fusion);
  for (const Case& c : cases) {
    const int e = c.args.num_experts, k = c.args.top_k;
    LinearWeight gate;
    auto gw = p.random(e * c.hidden, 0.02f);
    gate.weight = gpu.upload(Tensor::make(gw.data(), DType::kF32, {e, c.hidden}), DType::kBF16);
    auto bh = p.random(e, 0.01f);
    auto bias = gpu.upload(Tensor::make(bh.data(), DType::kF32, {e}), DType::kF32);
    for (int64_t t : {1, 8, 9, 32, 33}) {
      auto x = gpu.alloc(DType::kBF16, {t, c.hidden});
      auto step = [&] {  // as arch/deepseek.cc's moe_block
        auto logits = gpu.alloc(DType::kF32, {t, e});
        gpu.linear(*x, gate, *logits);
        auto ids = gpu.alloc(DType::kI32, {t, k}), w = gpu.alloc(DType::kF32, {t, k});
        gpu.moe_route(*logits, c.bias ? bias->view() : Tensor{}, c.args, *ids, *w);
        std::vector<float> out(size_t(t * k) * 2);
        gpu.download_f32(*ids, out.data());  // ends the step (graph mode: capture or replay)
        gpu.download_f32(*w, out.data() + t * k);
        return out;
      };
      std::vector<std::vector<float>> eager;
      for (uint64_t seed : {1, 2}) {
        gpu.fill_random(*x, seed, 1.0f);
        eager.push_back(step());
      }
      for (int max_tokens : {32, 0}) {
        gpu.tune([&](cuda::CudaTunables& tu) { tu.moe_router_route_max_tokens = max_tokens; });
        gpu.set_graph_mode(true);
        const cuda::GraphStats before = gpu.graph_stats();
        for (uint64_t seed : {1, 2, 1}) {
          gpu.fill_random(*x, seed, 1.0f);
          const auto got = step();
          EXPECT_EQ(0, std::memcmp(got.data(), eager[seed - 1].data(), got.size() * 4))
              << c.name << " T " << t << " max_tokens " << max_tokens << " seed " << seed;
        }
        const cuda::GraphStats& after = gpu.graph_stats();
        EXPECT_EQ(after.captures - before.captures, 1) << c.name << " T " << t;
        EXPECT_EQ(after.replays - before.replays, 2) << c.name << " T " << t;
        // Three steps: router + route, one launch when merged, else two (GEMV or cuBLAS, route).
        const int64_t per_step = t <= max_tokens ? 1 : 2;
        EXPECT_EQ(after.launches - before.launches, 3 * per_step)
            << c.name << " T " << t << " max_tokens " << max_tokens;
        gpu.set_graph_mode(false);
      }
      gpu.set_tunables(defaults);
    }
    std::printf("graph-mode router+route %-20s T 1, 8, 32, 33: eager bits, merged up to 32\n",
                c.name);
  }
}

}  // namespace
}  // namespace strata::parity
