// A per-head GEMV and the linear on its output as one launch (backend/cuda/head_gemv_linear.h:
// MLA's W_UV, then o_proj, which arch/mla.cc and arch/deepseek.cc record back to back). Graph
// mode merges them when CudaTunables::head_gemv_linear_fusion is on; the bound is equality with
// the eager run's two launches, bit for bit (the per-head outputs, which the merged launch still
// stores, and the linear's), over a capture and two replays (the grid barrier's word flips at
// every launch), and the step records one launch fewer (GraphStats::launches). Against the CPU
// backend's per_head_linear + linear on the same values: NMSE < 1e-4 (one bf16 rounding of the
// per-head outputs: ~1e-5).
//
// Shapes: one Kimi-K2.5 rank's W_UV + o_proj (8 heads of 128 from 512 latent values, hidden
// 7,168), Moonlight's (16 heads, hidden 2,048) at one warp a row and at up to 4 (gemv_max_ksplit),
// house-mla's (5 heads of 64 from 128, hidden 320), odd sizes with a bias, the Kimi shape with
// CTAs that do not wait at the barrier (timeout 0: the path for a grid that is not resident at
// once, each CTA making every per-head output itself); 1 and 2 tokens. Not merged, and still the
// eager bits: a DeepSeek-V3 rank's (16 heads into 7,168 rows: a CTA's rows do not fit its shared
// memory), a linear on another input, the tunable off.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "parity/fused_fixture.h"
#include "parity/op_pair.h"

namespace strata::parity {
namespace {

struct Case {
  const char* name;
  int64_t heads, n_head, k_head, n;
  bool bias, same_x, merges;  // merges: when the tunable is on
  int max_ksplit;             // CudaTunables::gemv_max_ksplit for the case (0: the default)
  bool no_wait;               // barrier timeout 0: every CTA makes every per-head output itself
};

struct Weights {  // the same values on both backends
  Pair::Both w_head;
  LinearWeight linear_cpu, linear_gpu;
};

Weights make_weights(Pair& p, const Case& c) {
  const int64_t k = c.heads * c.n_head;
  Weights w;
  w.w_head = p.make(p.random(c.heads * c.n_head * c.k_head, 1.0f / std::sqrt(float(c.k_head))),
                    {c.heads, c.n_head, c.k_head});
  Pair::Both linear = p.make(p.random(c.n * k, 1.0f / std::sqrt(float(k))), {c.n, k});
  w.linear_cpu.weight = std::move(linear.cpu);
  w.linear_gpu.weight = std::move(linear.gpu);
  if (c.bias) {
    Pair::Both bias = p.make(p.random(c.n, 0.1f), {c.n}, DType::kF32);
    w.linear_cpu.bias = std::move(bias.cpu);
    w.linear_gpu.bias = std::move(bias.gpu);
  }
  return w;
}

TEST(HeadGemvLinear, GraphModeMergesThePerHeadGemvIntoTheLinear) {
  Pair p;
  auto& gpu = p.cuda();
  const cuda::CudaTunables defaults = gpu.tunables();
  ASSERT_TRUE(defaults.fusion);
  const Case cases[] = {
      {"kimi-k2.5 rank W_UV + o_proj", 8, 128, 512, 7168, false, true, true, 0, false},
      {"kimi-k2.5 rank, no wait at the barrier", 8, 128, 512, 7168, false, true, true, 0, true},
      {"moonlight W_UV + o_proj", 16, 128, 512, 2048, false, true, true, 0, false},
      {"moonlight, up to 4 warps a row", 16, 128, 512, 2048, false, true, true, 4, false},
      {"house-mla W_UV + o_proj", 5, 64, 128, 320, false, true, true, 0, false},
      {"odd sizes, bias, 4 warps a row", 3, 40, 72, 333, true, true, true, 4, false},
      {"deepseek-v3 rank (rows too big)", 16, 128, 512, 7168, false, true, false, 0, false},
      {"another input", 8, 128, 512, 7168, false, false, false, 0, false},
  };

  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    gpu.tune([&](cuda::CudaTunables& t) {
      t.gemv_max_ksplit = c.max_ksplit > 0 ? c.max_ksplit : defaults.gemv_max_ksplit;
      t.head_gemv_linear_barrier_timeout_us =
          c.no_wait ? 0 : defaults.head_gemv_linear_barrier_timeout_us;
    });
    const cuda::CudaTunables with_ksplit = gpu.tunables();
    const Weights w = make_weights(p, c);
    const int64_t k = c.heads * c.n_head;
    for (int64_t m : {1, 2}) {
      ASSERT_LE(m, defaults.gemv_max_rows);
      auto x = gpu.alloc(DType::kBF16, {m, c.heads, c.k_head});
      auto x2 = gpu.alloc(DType::kBF16, {m, k});
      auto step = [&] {  // as arch/mla.cc's W_UV, then arch/deepseek.cc's o_proj
        auto mid = gpu.alloc(DType::kBF16, {m, c.heads, c.n_head});
        auto out = gpu.alloc(DType::kBF16, {m, c.n});
        gpu.per_head_linear(*x, 0, *w.w_head.gpu, *mid, 0);
        gpu.linear(c.same_x ? mid->view().reshape({m, k}) : x2->view(), w.linear_gpu, *out);
        std::vector<float> got(size_t(m * (k + c.n)));
        gpu.download_f32(*mid, got.data());  // ends the step (graph mode: capture or replay)
        gpu.download_f32(*out, got.data() + m * k);
        return got;
      };
      auto fill = [&](uint64_t seed) {
        gpu.fill_random(*x, seed, 1.0f);
        gpu.fill_random(*x2, seed + 10, 1.0f);
      };
      expect_merge_keeps_eager_bits(
          gpu, fill, step, [](cuda::CudaTunables& t, bool on) { t.head_gemv_linear_fusion = on; },
          [&](bool on) { return on && c.merges ? 1 : 2; },
          std::string(c.name) + " m " + std::to_string(m));
      gpu.set_tunables(with_ksplit);

      // The eager step of seed 1 against the CPU backend on the same values.
      if (!c.same_x) continue;
      fill(1);
      const std::vector<float> eager = step();
      std::vector<float> xv(size_t(m * c.heads * c.k_head));
      gpu.download_f32(*x, xv.data());
      auto xc =
          p.cpu_->upload(Tensor::make(xv.data(), DType::kF32, {m, c.heads, c.k_head}), DType::kF32);
      auto mid_c = p.cpu_->alloc(DType::kF32, {m, c.heads, c.n_head});
      auto out_c = p.cpu_->alloc(DType::kF32, {m, c.n});
      p.cpu_->per_head_linear(*xc, 0, *w.w_head.cpu, *mid_c, 0);
      p.cpu_->linear(mid_c->view().reshape({m, k}), w.linear_cpu, *out_c);
      const std::vector<float> want = p.get(*out_c, false);
      const std::vector<float> got(eager.begin() + m * k, eager.end());
      const double e = nmse(got, want);
      EXPECT_LT(e, 1e-4) << "m " << m;
      std::printf("head gemv + linear %-34s m %lld: eager bits, %s; NMSE vs CPU %.2g\n", c.name,
                  (long long)m, c.merges ? "one launch merged" : "two launches", e);
    }
    gpu.set_tunables(defaults);
  }
}

}  // namespace
}  // namespace strata::parity
