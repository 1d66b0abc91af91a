// Mixture-of-experts through the CUDA backend's ops (issue 23: backend/cuda/moe.cu) against the
// CPU reference backend, with weights uploaded by each backend's own upload_linear from the
// stored formats (bf16, INT4 group 32 / 128, FP8 128x128 blocks), and inside the DeepSeek
// fixtures. Every test also checks that no MoE op ran on the CPU twin unless it meant to.
//
// Bounds, with the reasoning:
// - Router linear (float32 logits): the same bf16 x and gate on both sides, float32 accumulation
//   in another order (the router GEMV's k split, or cuBLAS): relative error ~k · 2⁻²⁴ at worst,
//   NMSE bound 1e-10 (a wrong row or token gives ~1).
// - Route: the CPU's moe_route on the same float32 logits. A token's ids may differ only at a
//   near-tie: its CPU-side margin (float64: consecutive ranked choices in the top k + 1, and the
//   kept/dropped group boundary) below 1e-5 — the device's expf is 2 ulp off the host's — and
//   above 0 (exact ties, from logits on a 0.5 grid, break to the lower id on both sides). Such
//   tokens are counted, printed and held under 1%. Weights of equal choices: relative 1e-5.
// - Experts: the kernels dequantize to the CPU reference's exact bf16 weights; the GPU rounds
//   gate, up, act, each expert's output and the sum to bf16 (moe_experts_parity_test.cc: NMSE
//   ~6e-6), bound 4e-5. The fused add of the shared experts' output is inside the same rounding.
// - Graph mode: a MoE step replayed from a captured graph gives the bits of the eager run.
// - In the fixtures: every MoE layer's GPU choice against the CPU's moe_route of the GPU's own
//   logits (the route rule above), prefill (400 tokens: the prefill GEMMs) and token by token.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "arch/model.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/moe_experts_int4_reg.h"
#include "backend/cuda/moe_weights.h"
#include "model/config.h"
#include "parity/moe_stack.h"
#include "parity/op_pair.h"
#include "support/golden.h"

namespace strata {
namespace {

using parity::Fmt;
using parity::fmt_name;
using parity::Pair;

constexpr double kRouterNmse = 1e-10;
constexpr double kExpertsNmse = 4e-5;
constexpr double kNearTie = 1e-5;

// Calls of the MoE ops on the CPU twin so far.
int64_t moe_fallbacks(Backend& be) {
  int64_t n = 0;
  for (const auto& [op, calls] : be.cpu_fallback_counts())
    if (op == "moe_route" || op == "moe_experts" || op == "linear_f32_out") n += calls;
  return n;
}

// Device tensors from host values of any dtype (ids: int32).
template <class T>
DeviceTensorPtr to_gpu(Backend& be, const std::vector<T>& v, DType dt, const Shape& shape) {
  auto t = be.alloc(dt, shape);
  CUDA_CHECK(cudaMemcpy(t->view().data, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return t;
}
std::vector<float> host_f32(Backend& be, const Tensor& t) {
  std::vector<float> v(size_t(t.numel()));
  be.download_f32(t, v.data());
  return v;
}

// ---- router linear ----
TEST(MoeBackend, RouterLinearMatchesCpu) {
  Pair p;
  struct Case {
    int64_t experts, hidden;
    bool bias;
  };
  // T <= 32 with hidden % 32 == 0: the router GEMV; hidden 48 and T > 32: cuBLAS.
  for (const Case& c : {Case{8, 64, false}, Case{64, 2048, true}, Case{256, 7168, false},
                        Case{384, 7168, false}, Case{16, 48, true}}) {
    LinearWeight wc, wg;
    auto w = p.random(c.experts * c.hidden, 0.05f);
    Tensor wh = Tensor::make(w.data(), DType::kF32, {c.experts, c.hidden});
    wc.weight = p.cpu_->upload(wh, DType::kF32);
    wg.weight = p.gpu_->upload(wh, DType::kBF16);
    if (c.bias) {
      auto b = p.random(c.experts);
      Tensor bh = Tensor::make(b.data(), DType::kF32, {c.experts});
      wc.bias = p.cpu_->upload(bh, DType::kF32);
      wg.bias = p.gpu_->upload(bh, DType::kF32);
    }
    for (int64_t t : {1, 5, 8, 17, 32, 33, 512}) {
      auto x = p.make(p.random(t * c.hidden), {t, c.hidden});
      auto out_c = p.cpu_->alloc(DType::kF32, {t, c.experts});
      auto out_g = p.gpu_->alloc(DType::kF32, {t, c.experts});
      p.cpu_->linear(*x.cpu, wc, *out_c);
      std::vector<float> first;
      for (int rep = 0; rep < 3; ++rep) {  // the tile counters must be left at zero
        p.gpu_->linear(*x.gpu, wg, *out_g);
        const auto g = host_f32(*p.gpu_, *out_g), want = host_f32(*p.cpu_, *out_c);
        double num = 0, den = 0;
        for (size_t i = 0; i < g.size(); ++i) {
          num += std::isfinite(g[i]) ? double(g[i] - want[i]) * (g[i] - want[i]) : INFINITY;
          den += double(want[i]) * want[i];
        }
        EXPECT_LT(num / den, kRouterNmse) << "E " << c.experts << " H " << c.hidden << " T " << t;
        if (rep == 0) {
          first = g;
          std::printf("router E %3lld H %4lld bias %d T %3lld: nmse %.2e\n", (long long)c.experts,
                      (long long)c.hidden, int(c.bias), (long long)t, num / den);
        } else {
          EXPECT_EQ(g, first) << "not deterministic, T " << t;
        }
      }
    }
  }
  EXPECT_EQ(moe_fallbacks(*p.gpu_), 0);
}

// ---- route ----
// The CPU-side margin of a token's decisions in float64 (see the file comment).
double route_margin(const float* logits, const float* bias, const MoeRouteArgs& a) {
  const int e = a.num_experts;
  std::vector<double> score(static_cast<size_t>(e)), choice(static_cast<size_t>(e));
  double mx = -INFINITY, sum = 0;
  for (int i = 0; i < e; ++i) mx = std::max(mx, double(logits[i]));
  for (int i = 0; i < e; ++i) {
    score[size_t(i)] = a.scoring == MoeScoring::kSigmoid
                           ? 1.0 / (1.0 + std::exp(-double(logits[i])))
                           : std::exp(double(logits[i]) - mx);
    sum += score[size_t(i)];
  }
  for (int i = 0; i < e; ++i) {
    if (a.scoring == MoeScoring::kSoftmax) score[size_t(i)] /= sum;
    choice[size_t(i)] = score[size_t(i)] + (bias ? bias[i] : 0.0);
  }
  double margin = INFINITY;
  std::vector<bool> kept(size_t(e), true);
  if (a.num_groups > 1 && a.topk_groups < a.num_groups) {
    const int per = e / a.num_groups;
    std::vector<std::pair<double, int>> groups;
    for (int g = 0; g < a.num_groups; ++g) {
      std::vector<double> c(choice.begin() + g * per, choice.begin() + (g + 1) * per);
      std::sort(c.rbegin(), c.rend());
      groups.push_back(
          {a.group_score == MoeGroupScore::kMax ? c[0] : c[0] + (per > 1 ? c[1] : 0.0), g});
    }
    std::sort(groups.begin(), groups.end(), [](auto x, auto y) { return x.first > y.first; });
    margin = groups[size_t(a.topk_groups - 1)].first - groups[size_t(a.topk_groups)].first;
    for (int r = a.topk_groups; r < a.num_groups; ++r)
      for (int i = 0; i < per; ++i) kept[size_t(groups[size_t(r)].second * per + i)] = false;
  }
  std::vector<double> c;
  for (int i = 0; i < e; ++i)
    if (kept[size_t(i)]) c.push_back(choice[size_t(i)]);
  std::sort(c.rbegin(), c.rend());
  for (int r = 0; r < a.top_k && r + 1 < int(c.size()); ++r)
    margin = std::min(margin, c[size_t(r)] - c[size_t(r + 1)]);
  return margin;
}

struct RouteCase {
  const char* name;
  MoeRouteArgs args;
  bool bias, grid;  // grid: logits on a 0.5 grid (exact ties)
};

TEST(MoeBackend, RouteMatchesCpu) {
  Pair p;
  using S = MoeScoring;
  using G = MoeGroupScore;
  const RouteCase cases[] = {
      {"v2lite softmax", {64, 6, 1, 1, S::kSoftmax, G::kMax, false, 1.0f}, false, false},
      {"v2 softmax groups", {160, 6, 8, 3, S::kSoftmax, G::kMax, false, 16.0f}, false, false},
      {"v3 sigmoid bias groups", {256, 8, 8, 4, S::kSigmoid, G::kTop2Sum, true, 2.5f}, true, false},
      {"v3 ties", {256, 8, 8, 4, S::kSigmoid, G::kTop2Sum, true, 2.5f}, false, true},
      {"kimi sigmoid bias", {384, 8, 1, 1, S::kSigmoid, G::kTop2Sum, true, 2.827f}, true, false},
      {"moonlight ties", {64, 6, 1, 1, S::kSigmoid, G::kTop2Sum, true, 2.446f}, true, true},
      {"tiny fixture", {8, 2, 4, 2, S::kSigmoid, G::kTop2Sum, true, 2.5f}, true, false},
      {"softmax ties", {64, 6, 1, 1, S::kSoftmax, G::kMax, true, 1.0f}, false, true},
  };
  for (const RouteCase& c : cases) {
    const MoeRouteArgs& a = c.args;
    const int e = a.num_experts, k = a.top_k;
    std::vector<float> bias(static_cast<size_t>(e));
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (float& b : bias) b = c.grid ? 0.0f : 0.05f * nd(p.rng());
    auto bias_c = p.cpu_->upload(Tensor::make(bias.data(), DType::kF32, {e}), DType::kF32);
    auto bias_g = p.gpu_->upload(Tensor::make(bias.data(), DType::kF32, {e}), DType::kF32);
    for (int64_t t : {1, 7, 32, 512}) {
      std::vector<float> logits(static_cast<size_t>(t * e));
      for (float& l : logits)
        l = c.grid ? std::round(2.0f * nd(p.rng())) / 2.0f : 2.0f * nd(p.rng());
      auto lc = p.cpu_->upload(Tensor::make(logits.data(), DType::kF32, {t, e}), DType::kF32);
      auto lg = p.gpu_->upload(Tensor::make(logits.data(), DType::kF32, {t, e}), DType::kF32);
      auto ids_c = p.cpu_->alloc(DType::kI32, {t, k}), w_c = p.cpu_->alloc(DType::kF32, {t, k});
      auto ids_g = p.gpu_->alloc(DType::kI32, {t, k}), w_g = p.gpu_->alloc(DType::kF32, {t, k});
      const Tensor no_bias;
      p.cpu_->moe_route(*lc, c.bias ? bias_c->view() : no_bias, a, *ids_c, *w_c);
      p.gpu_->moe_route(*lg, c.bias ? bias_g->view() : no_bias, a, *ids_g, *w_g);
      const auto gi = host_f32(*p.gpu_, *ids_g), gw = host_f32(*p.gpu_, *w_g);
      const int32_t* ci = ids_c->view().ptr<int32_t>();
      const float* cw = w_c->view().ptr<float>();
      int near_ties = 0, bad = 0, bad_weights = 0;
      for (int64_t r = 0; r < t; ++r) {
        bool same = true;
        for (int j = 0; j < k; ++j) same &= int32_t(gi[size_t(r * k + j)]) == ci[r * k + j];
        if (!same) {
          const double m = route_margin(logits.data() + r * e, c.bias ? bias.data() : nullptr, a);
          (m > 0 && m < kNearTie ? near_ties : bad) += 1;
          continue;
        }
        for (int j = 0; j < k; ++j) {
          const double want = cw[r * k + j], got = gw[size_t(r * k + j)];
          bad_weights += !(std::fabs(got - want) <= 1e-5 * std::fabs(want) + 1e-7);
        }
      }
      std::printf("route %-24s T %3lld: near-ties %d, other differences %d\n", c.name, (long long)t,
                  near_ties, bad);
      EXPECT_EQ(bad, 0) << c.name << " T " << t;
      EXPECT_EQ(bad_weights, 0) << c.name << " T " << t;
      EXPECT_LE(near_ties, std::max<int64_t>(0, t / 100)) << c.name << " T " << t;
    }
  }
  EXPECT_EQ(moe_fallbacks(*p.gpu_), 0);
}

// ---- experts ----
struct ExpertCase {
  Fmt fmt;
  int64_t hidden, inter;
  int experts, top_k;
};
const ExpertCase kExpertCases[] = {
    {Fmt::kBf16, 64, 32, 8, 2},       {Fmt::kInt4g32, 64, 32, 8, 2},
    {Fmt::kFp8, 128, 128, 8, 2},      {Fmt::kBf16, 256, 128, 64, 6},
    {Fmt::kInt4g32, 512, 128, 64, 8}, {Fmt::kInt4g128, 512, 256, 16, 4},
    {Fmt::kFp8, 512, 256, 32, 8},
};

// Each token's k distinct experts (random), positive weights.
void random_routing(std::mt19937& rng, int64_t tokens, int experts, int k,
                    std::vector<int32_t>& ids, std::vector<float>& weights) {
  ids.resize(size_t(tokens * k));
  weights.resize(size_t(tokens * k));
  std::vector<int32_t> all(static_cast<size_t>(experts));
  std::uniform_real_distribution<float> wd(0.1f, 1.0f);
  for (int64_t t = 0; t < tokens; ++t) {
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    for (int j = 0; j < k; ++j) {
      ids[size_t(t * k + j)] = all[size_t(j)];
      weights[size_t(t * k + j)] = wd(rng);
    }
  }
}

// Both backends' experts from one stored stack pair.
struct Experts {
  MoeExpertWeights cpu, gpu;
};
Experts upload_experts(Pair& p, const HostLinearWeight& gu, const HostLinearWeight& dn) {
  Experts e;
  e.cpu.gate_up = p.cpu_->upload_linear(gu, Tensor{});
  e.cpu.down = p.cpu_->upload_linear(dn, Tensor{});
  e.gpu.gate_up = p.gpu_->upload_linear(gu, Tensor{});
  e.gpu.down = p.gpu_->upload_linear(dn, Tensor{});
  return e;
}
// A case's random gate_up and down stacks on both backends.
Experts random_experts(Pair& p, const ExpertCase& c) {
  const HostLinearWeight gu =
      parity::random_stack(p.rng(), c.fmt, c.experts, 2 * c.inter, c.hidden);
  const HostLinearWeight dn = parity::random_stack(p.rng(), c.fmt, c.experts, c.hidden, c.inter);
  return upload_experts(p, gu, dn);
}

// out (+ add) of one routing on both backends; returns the NMSE.
double experts_nmse(Pair& p, const Experts& ex, int64_t tokens, int k, bool with_add,
                    std::vector<float>* gpu_out) {
  const int64_t hidden = ex.cpu.hidden();
  const int experts = int(ex.cpu.num_experts());
  std::vector<int32_t> ids;
  std::vector<float> w;
  random_routing(p.rng(), tokens, experts, k, ids, w);
  auto x = p.make(p.random(tokens * hidden), {tokens, hidden});
  auto add = p.make(p.random(tokens * hidden, 0.5f), {tokens, hidden});
  auto ids_c = p.cpu_->alloc(DType::kI32, {tokens, k});  // CPU "device" memory is host memory
  std::memcpy(ids_c->view().data, ids.data(), ids.size() * 4);
  auto w_c = p.cpu_->upload(Tensor::make(w.data(), DType::kF32, {tokens, k}), DType::kF32);
  auto ids_g = to_gpu(*p.gpu_, ids, DType::kI32, {tokens, k});
  auto w_g = to_gpu(*p.gpu_, w, DType::kF32, {tokens, k});
  auto out = p.out({tokens, hidden});
  if (with_add) {
    p.cpu_->moe_experts_add(*x.cpu, ex.cpu, *ids_c, *w_c, *add.cpu, *out.cpu);
    p.gpu_->moe_experts_add(*x.gpu, ex.gpu, *ids_g, *w_g, *add.gpu, *out.gpu);
  } else {
    p.cpu_->moe_experts(*x.cpu, ex.cpu, *ids_c, *w_c, *out.cpu);
    p.gpu_->moe_experts(*x.gpu, ex.gpu, *ids_g, *w_g, *out.gpu);
  }
  if (gpu_out) *gpu_out = p.get(*out.gpu, true);
  return p.nmse(out);
}

TEST(MoeBackend, ExpertsMatchCpu) {
  Pair p;
  for (const ExpertCase& c : kExpertCases) {
    const Experts ex = random_experts(p, c);
    const char* why = nullptr;
    EXPECT_TRUE(cuda::moe_stack_tiled(ex.gpu.gate_up, &why) &&
                cuda::moe_stack_tiled(ex.gpu.down, &why))
        << fmt_name(c.fmt) << ": " << (why ? why : "");
    for (int64_t t : {1, 2, 8, 17, 32, 512}) {
      for (bool with_add : {false, true}) {
        const double e = experts_nmse(p, ex, t, c.top_k, with_add, nullptr);
        std::printf(
            "experts %-9s H %3lld I %3lld E %2d k %d T %3lld add %d (%s): nmse %.2e\n",
            fmt_name(c.fmt), (long long)c.hidden, (long long)c.inter, c.experts, c.top_k,
            (long long)t, int(with_add),
            cuda::moe_pick_regime(t, c.top_k, c.experts) == cuda::kMoeDecode ? "decode" : "prefill",
            e);
        EXPECT_LT(e, kExpertsNmse)
            << fmt_name(c.fmt) << " E " << c.experts << " T " << t << " add " << with_add;
      }
    }
  }
  EXPECT_EQ(moe_fallbacks(*p.gpu_), 0);
}

// The planned INT4 experts' down projection as one flat stream (CudaTunables::
// moe_int4_reg_flat_down, moe_experts_int4_flat.cu) against the CPU twin in the decode regime,
// by ids (T · k <= 64) and planned: k = 64 / 128 / 256 (1, 2, 4 tiles a row tile), groups 32
// and 128, plan tiles of 8 and 4 rows (x of 8 rows over 64 KB at hidden 5,120), warps whose
// share crosses experts.
TEST(MoeBackend, FlatDownMatchesCpu) {
  Pair p;
  const ExpertCase cases[] = {
      {Fmt::kInt4g32, 512, 256, 64, 8},
      {Fmt::kInt4g128, 1152, 128, 16, 4},
      {Fmt::kInt4g32, 256, 64, 32, 6},
      {Fmt::kInt4g32, 5120, 256, 16, 8},
  };
  for (const ExpertCase& c : cases) {
    const int group = c.fmt == Fmt::kInt4g32 ? 32 : 128;
    ASSERT_TRUE(cuda::int4_flat_down_fits(c.inter, group, 8)) << c.inter << " " << group;
    const Experts ex = random_experts(p, c);
    for (bool flat : {true, false}) {
      p.cuda().tune([&](cuda::CudaTunables& t) { t.moe_int4_reg_flat_down = flat; });
      for (int64_t t : {1, 2, 3, 8, 17, 32, 64}) {
        if (cuda::moe_pick_regime(t, c.top_k, c.experts) != cuda::kMoeDecode) continue;
        const double e = experts_nmse(p, ex, t, c.top_k, t % 2 == 1, nullptr);
        std::printf("flat down %d %-9s H %4lld I %3lld E %2d k %d T %2lld: nmse %.2e\n", int(flat),
                    fmt_name(c.fmt), (long long)c.hidden, (long long)c.inter, c.experts, c.top_k,
                    (long long)t, e);
        EXPECT_LT(e, kExpertsNmse) << fmt_name(c.fmt) << " H " << c.hidden << " T " << t;
      }
    }
  }
  p.cuda().tune([](cuda::CudaTunables& t) {
    t.moe_int4_reg_flat_down = cuda::CudaTunables{}.moe_int4_reg_flat_down;
  });
  EXPECT_EQ(moe_fallbacks(*p.gpu_), 0);
}

// The register GEMV with four row tiles a k tile (CudaTunables::moe_int4_reg_rows 4) in the
// experts modes against the CPU twin: gate_up and down by ids and planned, with the split gate_up
// and the flat down off so that both projections run it; intermediates of 2, 4, 6, 8 and 16
// gate/up pairs (a block's last group of four partial: 2 and 6), k % 64 == 32 (inter 96 and
// 32), groups 32 and 128.
TEST(MoeBackend, WideRowsMatchCpu) {
  Pair p;
  const ExpertCase cases[] = {
      {Fmt::kInt4g32, 512, 256, 64, 8}, {Fmt::kInt4g128, 1152, 128, 16, 4},
      {Fmt::kInt4g32, 256, 64, 32, 6},  {Fmt::kInt4g32, 384, 96, 16, 6},
      {Fmt::kInt4g32, 320, 32, 8, 2},
  };
  for (const ExpertCase& c : cases) {
    const Experts ex = random_experts(p, c);
    for (bool others : {false, true}) {  // the split gate_up and flat down off, then on
      p.cuda().tune([&](cuda::CudaTunables& t) {
        t.moe_int4_reg_rows = 4;
        t.moe_int4_split_gate_up = others;
        t.moe_int4_reg_flat_down = others;
      });
      for (int64_t t : {1, 2, 3, 8, 17, 32, 64}) {
        if (cuda::moe_pick_regime(t, c.top_k, c.experts) != cuda::kMoeDecode) continue;
        const double e = experts_nmse(p, ex, t, c.top_k, t % 2 == 1, nullptr);
        std::printf("wide rows %d %-9s H %4lld I %3lld E %2d k %d T %2lld: nmse %.2e\n",
                    int(others), fmt_name(c.fmt), (long long)c.hidden, (long long)c.inter,
                    c.experts, c.top_k, (long long)t, e);
        EXPECT_LT(e, kExpertsNmse) << fmt_name(c.fmt) << " H " << c.hidden << " T " << t;
      }
    }
  }
  p.cuda().tune([](cuda::CudaTunables& t) {
    const cuda::CudaTunables d;
    t.moe_int4_reg_rows = d.moe_int4_reg_rows;
    t.moe_int4_split_gate_up = d.moe_int4_split_gate_up;
    t.moe_int4_reg_flat_down = d.moe_int4_reg_flat_down;
  });
  EXPECT_EQ(moe_fallbacks(*p.gpu_), 0);
}

// The INT4 experts' gate_up unrounded against the CPU twin: the register GEMV's (CudaTunables::
// moe_int4_gate_up_round off; one and four row tiles a k tile) and the split gate_up's at group 32
// (moe_int4_split_round off), each beside its rounded form, the flat down rounding as ever;
// planned and by ids, groups 32 and 128, down k 256 / 128 / 96. The rounded forms' bound:
// unrounded weights are (nibble - 8) · scale exactly where the twin rounds them to bf16 first
// (2^-9 relative a weight); the register GEMV's measured 1.3e-5 to 2.0e-5 (H100, 2026-12-06) as
// the rounded ones. And each knob reaches its kernel: the outputs differ from the rounded ones on
// the same routing and x, at T = 17 (planned in every case) and at T = 3 (by ids: the split).
// Form 4: the split unrounded where it runs by TMA (SplitGateUpTmaShapes: where that is).
TEST(MoeBackend, UnroundedGateUpMatchesCpu) {
  struct Form {
    bool reg_round;
    int split_round, rows;
  };
  const Form forms[] = {{false, 1, 1}, {false, 1, 4}, {true, 0, 4}, {true, 1, 4}, {true, -1, 4}};
  Pair p;
  const ExpertCase cases[] = {
      {Fmt::kInt4g32, 512, 256, 64, 8},
      {Fmt::kInt4g128, 1152, 128, 16, 4},
      {Fmt::kInt4g32, 384, 96, 16, 6},
  };
  for (const ExpertCase& c : cases) {
    const Experts ex = random_experts(p, c);
    std::vector<float> outs[5][2];  // [form][T = 17, T = 3]
    for (int fi = 0; fi < 5; ++fi) {
      const Form& f = forms[fi];
      p.cuda().tune([&](cuda::CudaTunables& t) {
        t.moe_int4_gate_up_round = f.reg_round;
        t.moe_int4_split_round = f.split_round;
        t.moe_int4_reg_rows = f.rows;
      });
      for (int64_t t : {1, 3, 8, 17, 32, 64}) {
        if (cuda::moe_pick_regime(t, c.top_k, c.experts) != cuda::kMoeDecode) continue;
        const double e = experts_nmse(p, ex, t, c.top_k, t % 2 == 1, nullptr);
        std::printf(
            "gate_up round %d split round %d rows %d %-9s H %4lld I %3lld E %2d k %d T %2lld: "
            "nmse %.2e\n",
            int(f.reg_round), f.split_round, f.rows, fmt_name(c.fmt), (long long)c.hidden,
            (long long)c.inter, c.experts, c.top_k, (long long)t, e);
        EXPECT_LT(e, kExpertsNmse) << fmt_name(c.fmt) << " H " << c.hidden << " T " << t;
      }
      ASSERT_EQ(cuda::moe_pick_regime(17, c.top_k, c.experts), cuda::kMoeDecode);
      for (int j = 0; j < 2; ++j) {
        p.rng().seed(17);  // the same routing and x for every form
        experts_nmse(p, ex, j == 0 ? 17 : 3, c.top_k, false, &outs[fi][j]);
      }
    }
    // Forms 1 (register GEMV unrounded), 2 (split unrounded) against 3 (both rounded).
    EXPECT_NE(outs[1][0], outs[3][0]) << fmt_name(c.fmt) << " H " << c.hidden;
    EXPECT_EQ(outs[1][1], outs[3][1]) << fmt_name(c.fmt) << " H " << c.hidden;  // the split's
    EXPECT_EQ(outs[2][0], outs[3][0]) << fmt_name(c.fmt) << " H " << c.hidden;  // the GEMV's
    if (c.fmt == Fmt::kInt4g32)
      EXPECT_NE(outs[2][1], outs[3][1]) << fmt_name(c.fmt) << " H " << c.hidden;
    else
      EXPECT_EQ(outs[2][1], outs[3][1]) << fmt_name(c.fmt) << " H " << c.hidden;  // rounds
  }
  p.cuda().tune([](cuda::CudaTunables& t) {
    const cuda::CudaTunables d;
    t.moe_int4_gate_up_round = d.moe_int4_gate_up_round;
    t.moe_int4_split_round = d.moe_int4_split_round;
    t.moe_int4_reg_rows = d.moe_int4_reg_rows;
  });
  EXPECT_EQ(moe_fallbacks(*p.gpu_), 0);
}

// The gate_up projection by ids with each tile pair's k split over a cluster (CudaTunables::
// moe_int4_split_gate_up, moe_experts_int4_gate_up.cu) against the CPU twin at T = 1 to 8
// (T · k <= 64): groups 32 and 128, k tiles not a multiple of the warps (hidden 1,152 = 18
// tiles), every cluster size, 1 to 8 warps, both rings, and the weights by bulk copies (TMA:
// the launcher's choice: the whole stream where the grid is one wave, a ring of slots elsewhere;
// forced at 1, 3, 4 and 8 warps, clusters of 1, 2, 4 and 8). (Bits across runs:
// GraphReplayMatchesEager with the knob on.)
TEST(MoeBackend, SplitGateUpMatchesCpu) {
  Pair p;
  const ExpertCase cases[] = {
      {Fmt::kInt4g32, 7168, 256, 64, 8},
      {Fmt::kInt4g128, 1152, 128, 16, 4},
      {Fmt::kInt4g32, 2048, 1408, 8, 6},
  };
  struct Shape {
    int cluster, warps, ring, tma;  // tma -1: the launcher's (TMA where the grid is one wave)
  };
  const Shape shapes[] = {{0, 0, 0, -1}, {0, 0, 0, 0}, {1, 8, 4, 0}, {2, 4, 2, 0},
                          {4, 4, 4, 0},  {8, 2, 4, 0}, {8, 1, 2, 0}, {1, 8, 0, 1},
                          {2, 4, 0, 1},  {8, 1, 0, 1}, {1, 3, 0, 1}, {4, 4, 0, 1}};
  for (const ExpertCase& c : cases) {
    const Experts ex = random_experts(p, c);
    for (const Shape& sh : shapes) {
      p.cuda().tune([&](cuda::CudaTunables& t) {
        t.moe_int4_split_gate_up = true;
        t.moe_int4_split_cluster = sh.cluster;
        t.moe_int4_split_warps = sh.warps;
        t.moe_int4_split_ring = sh.ring;
        t.moe_int4_split_tma = sh.tma;
      });
      for (int64_t t : {1, 2, 5, 8}) {
        if (t * c.top_k > cuda::CudaTunables{}.moe_int4_reg_max_assignments) continue;
        std::vector<float> first;
        const double e = experts_nmse(p, ex, t, c.top_k, t % 2 == 0, &first);
        std::printf(
            "split gate_up c%d w%d r%d tma %d %-9s H %4lld I %4lld E %2d k %d T %lld: nmse %.2e\n",
            sh.cluster, sh.warps, sh.ring, sh.tma, fmt_name(c.fmt), (long long)c.hidden,
            (long long)c.inter, c.experts, c.top_k, (long long)t, e);
        EXPECT_LT(e, kExpertsNmse) << fmt_name(c.fmt) << " H " << c.hidden << " T " << t;
        EXPECT_TRUE(
            std::all_of(first.begin(), first.end(), [](float v) { return std::isfinite(v); }));
      }
    }
  }
  p.cuda().tune([](cuda::CudaTunables& t) {
    const cuda::CudaTunables d;
    t.moe_int4_split_gate_up = d.moe_int4_split_gate_up;
    t.moe_int4_split_cluster = d.moe_int4_split_cluster;
    t.moe_int4_split_warps = d.moe_int4_split_warps;
    t.moe_int4_split_ring = d.moe_int4_split_ring;
    t.moe_int4_split_tma = d.moe_int4_split_tma;
  });
  EXPECT_EQ(moe_fallbacks(*p.gpu_), 0);
}

// The launcher's TMA shapes: a Kimi-K2.5 rank at one token (128 tile pairs, one wave) streams
// each warp's 14 k tiles in two batches (-1, the default, takes it); at two tokens (256 pairs)
// the default keeps the register ring, and TMA forced (1) runs a ring of batches of 4 tiles at
// two CTAs an SM that holds less than the whole stream.
TEST(MoeBackend, SplitGateUpTmaShapes) {
  auto kimi_rank = [](int tokens, int tma) {
    cuda::Int4SplitGateUpParams s{};
    s.k = 7168;
    s.inter = 256;
    s.expert_tiles = int64_t(2 * 256 / 16) * (7168 / 64);
    s.assignments = 8 * tokens;
    s.x_div = 8;
    s.num_experts = 384;
    s.group = 32;
    s.tma = tma;
    s.unrounded = -1;  // unrounded where by TMA (CudaTunables::moe_int4_split_round -1)
    EXPECT_TRUE(cuda::int4_split_gate_up_shape(&s)) << tokens << " tokens, tma " << tma;
    EXPECT_EQ(s.unrounded, s.tma) << tokens << " tokens, tma " << tma;
    return s;
  };
  const cuda::Int4SplitGateUpParams one = kimi_rank(1, -1);
  EXPECT_EQ(one.tma, 1);
  EXPECT_EQ(one.tma_stages, 2);
  EXPECT_EQ(one.tma_tiles, 7);
  EXPECT_EQ(kimi_rank(2, -1).tma, 0);
  const cuda::Int4SplitGateUpParams forced = kimi_rank(2, 1);
  EXPECT_EQ(forced.tma, 1);
  EXPECT_EQ(forced.tma_tiles, 4);
  EXPECT_LT(forced.tma_tiles * forced.tma_stages, 14);
  EXPECT_GE(forced.tma_stages, 2);
}

// Shapes the kernels refuse run on the CPU twin, counted: more experts than kMoeMaxExperts
// (weights kept row-major), and top-k above 32 over tiled weights (the twin untiles them).
TEST(MoeBackend, RefusedShapesRunOnTheTwin) {
  Pair p;
  struct Case {
    Fmt fmt;
    int64_t hidden, inter;
    int experts, top_k;
    bool tiled;
  };
  int64_t expected_calls = 0;
  for (const Case& c :
       {Case{Fmt::kBf16, 64, 32, 1100, 2, false}, Case{Fmt::kBf16, 64, 32, 48, 40, true},
        Case{Fmt::kFp8, 128, 128, 40, 36, true}, Case{Fmt::kInt4g32, 64, 64, 40, 33, true}}) {
    const Experts ex = random_experts(p, ExpertCase{c.fmt, c.hidden, c.inter, c.experts, c.top_k});
    EXPECT_EQ(cuda::moe_stack_tiled(ex.gpu.gate_up), c.tiled)
        << fmt_name(c.fmt) << " E " << c.experts;
    const double e = experts_nmse(p, ex, 5, c.top_k, true, nullptr);
    expected_calls += 1;
    std::printf("twin experts %-9s E %4d k %2d: nmse %.2e\n", fmt_name(c.fmt), c.experts, c.top_k,
                e);
    // The twin computes in float32 from the same bf16 weights: only the output's rounding.
    EXPECT_LT(e, 1e-5) << fmt_name(c.fmt) << " E " << c.experts;
  }
  // Routing over more than 1024 experts.
  const MoeRouteArgs a{.num_experts = 1100, .top_k = 4};
  auto logits = p.random(3 * 1100);
  auto lg = p.gpu_->upload(Tensor::make(logits.data(), DType::kF32, {3, 1100}), DType::kF32);
  auto ids = p.gpu_->alloc(DType::kI32, {3, 4}), w = p.gpu_->alloc(DType::kF32, {3, 4});
  p.gpu_->moe_route(*lg, Tensor{}, a, *ids, *w);
  std::map<std::string, int64_t> calls;
  for (const auto& [op, n] : p.gpu_->cpu_fallback_counts()) calls[op] = n;
  EXPECT_EQ(calls["moe_experts"], expected_calls);
  EXPECT_EQ(calls["moe_route"], 1);
  EXPECT_EQ(calls["linear_f32_out"], 0);
}

// A whole MoE step (router, route, experts with the shared output added) captured as a CUDA
// graph and replayed with new inputs: the bits of the eager runs. INT4 also with the split
// gate_up (moe_int4_split_gate_up: one token, 4 assignments, by ids).
TEST(MoeBackend, GraphReplayMatchesEager) {
  Pair p;
  auto& gpu = p.cuda();
  for (auto [f, split] : {std::pair{Fmt::kBf16, false}, std::pair{Fmt::kFp8, false},
                          std::pair{Fmt::kInt4g32, false}, std::pair{Fmt::kInt4g32, true}}) {
    gpu.tune([&](cuda::CudaTunables& t) { t.moe_int4_split_gate_up = split; });
    const int64_t hidden = 256, inter = 128;
    const int experts = 32, k = 4;
    const Experts ex =
        upload_experts(p, parity::random_stack(p.rng(), f, experts, 2 * inter, hidden),
                       parity::random_stack(p.rng(), f, experts, hidden, inter));
    LinearWeight gate;
    auto gw = p.random(experts * hidden, 0.05f);
    gate.weight = gpu.upload(Tensor::make(gw.data(), DType::kF32, {experts, hidden}), DType::kBF16);
    const MoeRouteArgs a{.num_experts = experts,
                         .top_k = k,
                         .num_groups = 4,
                         .topk_groups = 2,
                         .scoring = MoeScoring::kSigmoid,
                         .group_score = MoeGroupScore::kTop2Sum,
                         .normalize = true,
                         .scaling_factor = 2.5f};
    for (int64_t t : {1, 300}) {
      auto x = gpu.alloc(DType::kBF16, {t, hidden}), add = gpu.alloc(DType::kBF16, {t, hidden});
      auto out = gpu.alloc(DType::kBF16, {t, hidden});
      auto step = [&] {
        auto logits = gpu.alloc(DType::kF32, {t, experts});
        gpu.linear(*x, gate, *logits);
        auto ids = gpu.alloc(DType::kI32, {t, k}), w = gpu.alloc(DType::kF32, {t, k});
        gpu.moe_route(*logits, Tensor{}, a, *ids, *w);
        gpu.moe_experts_add(*x, ex.gpu, *ids, *w, *add, *out);
        std::vector<float> o(static_cast<size_t>(t * hidden));
        gpu.download_f32(*out, o.data());  // ends the step (graph mode: capture or replay)
        return o;
      };
      std::vector<std::vector<float>> eager;
      for (uint64_t seed : {1, 2}) {
        gpu.fill_random(*x, seed, 1.0f);
        gpu.fill_random(*add, seed + 10, 0.5f);
        eager.push_back(step());
      }
      gpu.set_graph_mode(true);
      const cuda::GraphStats before = gpu.graph_stats();
      for (uint64_t seed : {1, 2, 1}) {
        gpu.fill_random(*x, seed, 1.0f);
        gpu.fill_random(*add, seed + 10, 0.5f);
        EXPECT_EQ(step(), eager[seed - 1]) << fmt_name(f) << " T " << t << " seed " << seed;
      }
      EXPECT_EQ(gpu.graph_stats().captures - before.captures, 1) << fmt_name(f) << " T " << t;
      EXPECT_EQ(gpu.graph_stats().replays - before.replays, 2) << fmt_name(f) << " T " << t;
      gpu.set_graph_mode(false);
    }
  }
  gpu.tune([](cuda::CudaTunables& t) {
    t.moe_int4_split_gate_up = cuda::CudaTunables{}.moe_int4_split_gate_up;
  });
  EXPECT_EQ(moe_fallbacks(gpu), 0);
}

// The real models' expert stacks are tiled, at the planner's bytes (core/weight_format.cc
// linear_device_bytes): Kimi-K2.5 and DeepSeek-V3 one tp-8 rank, Moonlight at tp 1.
TEST(MoeBackend, RealExpertShapesAreTiledAtThePlannersBytes) {
  const LinearFormat i4{.format = WeightFormat::kInt4Group, .group_size = 32};
  const LinearFormat f8{.format = WeightFormat::kFp8Block, .block_out = 128, .block_in = 128};
  const LinearFormat b16{.format = WeightFormat::kDense, .dense_dtype = DType::kBF16};
  struct Shape3 {
    LinearFormat f;
    int64_t stack, n, k;
  };
  for (const Shape3& s :
       {Shape3{i4, 384, 512, 7168}, Shape3{i4, 384, 7168, 256}, Shape3{f8, 256, 512, 7168},
        Shape3{f8, 256, 7168, 256}, Shape3{b16, 64, 2816, 2048}, Shape3{b16, 64, 2048, 1408}}) {
    const char* why = nullptr;
    EXPECT_TRUE(cuda::moe_stack_tiled(s.f, s.stack, s.n, s.k, false, &why))
        << s.f.str() << ": " << (why ? why : "");
    const int fmt = s.f.format == WeightFormat::kInt4Group  ? cuda::kMoeInt4
                    : s.f.format == WeightFormat::kFp8Block ? cuda::kMoeFp8
                                                            : cuda::kMoeBf16;
    const int64_t scales = fmt == cuda::kMoeFp8
                               ? cuda::moe_fp8_scale_slot(s.n, s.k) * 4
                               : cuda::moe_scale_bytes(fmt, s.n, s.k, s.f.group_size);
    EXPECT_EQ(cuda::moe_values_bytes(fmt, s.n, s.k) + scales, linear_device_bytes(s.f, s.n, s.k))
        << s.f.str() << " [" << s.n << ", " << s.k << "]";
  }
}

// ---- inside the DeepSeek fixtures ----
struct Fixture {
  std::string name, dir;
};
class MoeModel : public ::testing::TestWithParam<Fixture> {};

TEST_P(MoeModel, RoutingMatchesCpuInEveryLayer) {
  auto gpu = make_cuda_backend();
  auto cpu = make_cpu_backend();
  auto m = load_model(GetParam().dir, *gpu);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  Model& model = **m;
  const MoeRouteArgs args = route_args_from(model.spec());
  const int e = args.num_experts, k = args.top_k;
  // Per MoE layer of the current step: the GPU's logits, correction bias, ids and weights.
  std::map<int, std::vector<float>> logits, bias, ids, weights;
  model.set_tracer([&](std::string_view name, int layer, const Tensor& t) {
    if (name == "router_logits") logits[layer] = host_f32(*gpu, t);
    if (name == "router_bias") bias[layer] = host_f32(*gpu, t);
    if (name == "topk_ids") ids[layer] = host_f32(*gpu, t);
    if (name == "topk_weights") weights[layer] = host_f32(*gpu, t);
  });
  int64_t tokens = 0, near_ties = 0, bad = 0, bad_weights = 0;
  auto check_step = [&] {
    ASSERT_FALSE(logits.empty());
    for (auto& [layer, l] : logits) {
      const int64_t t = int64_t(l.size()) / e;
      const float* b = bias.count(layer) ? bias[layer].data() : nullptr;
      auto lc = cpu->upload(Tensor::make(l.data(), DType::kF32, {t, e}), DType::kF32);
      auto bc = b ? cpu->upload(Tensor::make(bias[layer].data(), DType::kF32, {e}), DType::kF32)
                  : nullptr;
      auto ic = cpu->alloc(DType::kI32, {t, k}), wc = cpu->alloc(DType::kF32, {t, k});
      cpu->moe_route(*lc, bc ? bc->view() : Tensor{}, args, *ic, *wc);
      const std::vector<float>& gi = ids[layer];
      const std::vector<float>& gw = weights[layer];
      for (int64_t r = 0; r < t; ++r) {
        bool same = true;
        for (int j = 0; j < k; ++j)
          same &= int32_t(gi[size_t(r * k + j)]) == ic->view().ptr<int32_t>()[r * k + j];
        if (!same) {
          const double margin = route_margin(l.data() + r * e, b, args);
          (margin > 0 && margin < kNearTie ? near_ties : bad) += 1;
          continue;
        }
        for (int j = 0; j < k; ++j) {
          const double want = wc->view().ptr<float>()[r * k + j], got = gw[size_t(r * k + j)];
          bad_weights += !(std::fabs(got - want) <= 1e-5 * std::fabs(want) + 1e-7);
        }
      }
      tokens += t;
    }
    logits.clear();
    bias.clear();
    ids.clear();
    weights.clear();
  };
  testing::Reference ref(GetParam().dir + "/reference.safetensors");
  ASSERT_TRUE(ref.ok());
  for (int i = 0; ref.has("seq" + std::to_string(i) + ".input_ids"); ++i) {
    auto seq = ref.i32("seq" + std::to_string(i) + ".input_ids");
    for (int chunk : {int(seq.size()), 1}) {  // prefill in one step, then token by token
      testing::SingleSequence run(model, 3, int(seq.size()), DType::kBF16);
      for (size_t at = 0; at < seq.size(); at += size_t(chunk)) {
        run.step(std::vector<int32_t>(seq.begin() + long(at),
                                      seq.begin() + long(std::min(seq.size(), at + chunk))),
                 false);
        check_step();
      }
    }
  }
  // The long reference (400 tokens in one step: the prefill regime's plan and GEMMs).
  const std::string long_path = GetParam().dir + "/reference-long.safetensors";
  if (std::ifstream(long_path).good()) {
    testing::Reference lr(long_path);
    auto seq = lr.i32("long0.input_ids");
    testing::SingleSequence run(model, 16, int(seq.size()), DType::kBF16);
    const auto got = run.step(seq, true);
    check_step();
    const double e_long = testing::nmse(got, lr.f32("long0.logits"));
    std::printf("%s long0 (%zu tokens, one step): logits nmse vs HF %.3g\n",
                GetParam().name.c_str(), seq.size(), e_long);
    EXPECT_LT(e_long, 6e-2) << "long0";  // quant_model_parity_test.cc's DeepSeek envelope
  }
  std::printf(
      "%s: %lld routed tokens (layers x tokens) checked, near-ties %lld, other differences %lld\n",
      GetParam().name.c_str(), (long long)tokens, (long long)near_ties, (long long)bad);
  EXPECT_EQ(bad, 0);
  EXPECT_EQ(bad_weights, 0);
  EXPECT_LE(near_ties, tokens / 100);
  EXPECT_EQ(moe_fallbacks(*gpu), 0) << "MoE ops on the CPU twin";
}

INSTANTIATE_TEST_SUITE_P(Fixtures, MoeModel,
                         ::testing::Values(Fixture{"deepseek_v3_mla_moe", STRATA_SHARED_DIR
                                                   "/fixtures/tiny/deepseek-v3-mla-moe"},
                                           Fixture{"deepseek_v3_int4_experts", STRATA_SHARED_DIR
                                                   "/fixtures/tiny/deepseek-v3-int4-experts"},
                                           Fixture{"deepseek_v2lite_style", STRATA_SHARED_DIR
                                                   "/fixtures/tiny/deepseek-v2lite-style"},
                                           Fixture{"deepseek_v3_fp8_block", STRATA_REPO_FIXTURES_DIR
                                                   "/tiny/deepseek-v3-fp8-block"}),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace strata
