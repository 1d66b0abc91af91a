// The backend's MoE ops (moe_route, moe_experts) on hand-made routing cases whose answers follow
// from transformers 5.17's DeepSeek-V2/V3 routers, and on random experts against a double-precision
// sum.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <vector>

#include "backend/backend.h"

namespace strata {
namespace {

struct Routed {
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

// Routes one token; ids come back sorted with their weights.
Routed route(Backend& be, std::vector<float> logits, std::vector<float> bias,
             const MoeRouteArgs& a) {
  auto l = be.upload(Tensor::make(logits.data(), DType::kF32, {1, a.num_experts}), DType::kF32);
  DeviceTensorPtr b;
  if (!bias.empty())
    b = be.upload(Tensor::make(bias.data(), DType::kF32, {a.num_experts}), DType::kF32);
  auto ids = be.alloc(DType::kI32, {1, a.top_k});
  auto w = be.alloc(DType::kF32, {1, a.top_k});
  be.moe_route(*l, b ? b->view() : Tensor{}, a, *ids, *w);
  std::vector<std::pair<int32_t, float>> r;
  for (int j = 0; j < a.top_k; ++j)
    r.push_back({ids->view().ptr<int32_t>()[j], w->view().ptr<float>()[j]});
  std::sort(r.begin(), r.end());
  Routed out;
  for (auto [i, x] : r) out.ids.push_back(i), out.weights.push_back(x);
  return out;
}

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

TEST(MoeRoute, GroupScoreTop2SumVersusMax) {
  auto be = make_cpu_backend();
  // Group 0 has the single best expert, group 1 the best pair.
  const std::vector<float> logits = {3.0f, -5.0f, 1.5f, 1.5f, -5.0f, -5.0f, -5.0f, -5.0f};
  MoeRouteArgs a{.num_experts = 8,
                 .top_k = 2,
                 .num_groups = 4,
                 .topk_groups = 1,
                 .scoring = MoeScoring::kSigmoid,
                 .group_score = MoeGroupScore::kTop2Sum,
                 .normalize = true,
                 .scaling_factor = 2.5f};
  Routed r = route(*be, logits, {}, a);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{2, 3}));
  EXPECT_NEAR(r.weights[0], 1.25f, 1e-6);  // normalized halves, times 2.5
  a.group_score = MoeGroupScore::kMax;
  r = route(*be, logits, {}, a);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 1}));
  const float s0 = sigmoid(3.0f), s1 = sigmoid(-5.0f);
  EXPECT_NEAR(r.weights[0], 2.5f * s0 / (s0 + s1), 1e-6);
}

TEST(MoeRoute, CorrectionBiasChoosesButDoesNotWeigh) {
  auto be = make_cpu_backend();
  MoeRouteArgs a{.num_experts = 4,
                 .top_k = 1,
                 .num_groups = 1,
                 .topk_groups = 1,
                 .scoring = MoeScoring::kSigmoid,
                 .group_score = MoeGroupScore::kTop2Sum,
                 .normalize = false,
                 .scaling_factor = 2.5f};
  Routed r = route(*be, {1.0f, 0.5f, 0.0f, 0.0f}, {0.0f, 0.5f, 0.0f, 0.0f}, a);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{1}));
  EXPECT_NEAR(r.weights[0], 2.5f * sigmoid(0.5f), 1e-6);
}

// Experts outside the chosen groups are out even when every biased score inside is negative
// (transformers 5.17 masks them to -inf; an older 0.0 mask would have let them win here).
TEST(MoeRoute, UnchosenGroupsNeverWin) {
  auto be = make_cpu_backend();
  MoeRouteArgs a{.num_experts = 4,
                 .top_k = 2,
                 .num_groups = 2,
                 .topk_groups = 1,
                 .scoring = MoeScoring::kSigmoid,
                 .group_score = MoeGroupScore::kTop2Sum,
                 .normalize = true,
                 .scaling_factor = 1.0f};
  Routed r = route(*be, {0.0f, 0.0f, 0.0f, 0.0f}, {-2.0f, -2.0f, -3.0f, -3.0f}, a);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 1}));
  EXPECT_NEAR(r.weights[0], 0.5f, 1e-6);
}

TEST(MoeRoute, SoftmaxGreedy) {
  auto be = make_cpu_backend();
  MoeRouteArgs a{.num_experts = 4,
                 .top_k = 2,
                 .num_groups = 1,
                 .topk_groups = 1,
                 .scoring = MoeScoring::kSoftmax,
                 .group_score = MoeGroupScore::kMax,
                 .normalize = false,
                 .scaling_factor = 1.0f};
  Routed r = route(*be, {0.0f, std::log(2.0f), std::log(3.0f), 0.0f}, {}, a);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{1, 2}));
  EXPECT_NEAR(r.weights[0], 2.0f / 7.0f, 1e-6);
  EXPECT_NEAR(r.weights[1], 3.0f / 7.0f, 1e-6);
}

TEST(MoeExperts, MatchesPerTokenSum) {
  const int experts = 5, hidden = 7, inter = 6, tokens = 9, top_k = 2;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 0.5f);
  auto randv = [&](size_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = nd(rng);
    return v;
  };
  auto gate_up = randv(size_t(experts * 2 * inter * hidden));
  auto down = randv(size_t(experts * hidden * inter));
  auto x = randv(size_t(tokens * hidden));
  std::vector<int32_t> ids;
  std::vector<float> weights;
  for (int t = 0; t < tokens; ++t) {
    const int a = t % experts,
              b = (t * 3 + 1) % experts == a ? (a + 1) % experts : (t * 3 + 1) % experts;
    ids.insert(ids.end(), {a, b});
    weights.insert(weights.end(), {0.25f + 0.1f * t, 1.0f - 0.05f * t});
  }
  auto be = make_cpu_backend();
  MoeExpertWeights w;
  w.gate_up.weight = be->upload(
      Tensor::make(gate_up.data(), DType::kF32, {experts, 2 * inter, hidden}), DType::kF32);
  w.gate_up.stack = experts;
  w.down.weight =
      be->upload(Tensor::make(down.data(), DType::kF32, {experts, hidden, inter}), DType::kF32);
  w.down.stack = experts;
  auto xt = be->upload(Tensor::make(x.data(), DType::kF32, {tokens, hidden}), DType::kF32);
  auto idt = be->alloc(DType::kI32, {tokens, top_k});
  std::copy(ids.begin(), ids.end(), idt->view().ptr<int32_t>());
  auto wt = be->upload(Tensor::make(weights.data(), DType::kF32, {tokens, top_k}), DType::kF32);
  auto out = be->alloc(DType::kF32, {tokens, hidden});
  be->moe_experts(*xt, w, *idt, *wt, *out);

  double max_err = 0;
  for (int t = 0; t < tokens; ++t) {
    std::vector<double> y(static_cast<size_t>(hidden), 0.0);
    for (int j = 0; j < top_k; ++j) {
      const int e = ids[size_t(t * top_k + j)];
      std::vector<double> act(static_cast<size_t>(inter));
      for (int i = 0; i < inter; ++i) {
        double g = 0, u = 0;
        for (int k = 0; k < hidden; ++k) {
          g += gate_up[size_t((e * 2 * inter + i) * hidden + k)] * x[size_t(t * hidden + k)];
          u +=
              gate_up[size_t((e * 2 * inter + inter + i) * hidden + k)] * x[size_t(t * hidden + k)];
        }
        act[size_t(i)] = g / (1 + std::exp(-g)) * u;
      }
      for (int k = 0; k < hidden; ++k) {
        double s = 0;
        for (int i = 0; i < inter; ++i)
          s += down[size_t((e * hidden + k) * inter + i)] * act[size_t(i)];
        y[size_t(k)] += weights[size_t(t * top_k + j)] * s;
      }
    }
    for (int k = 0; k < hidden; ++k)
      max_err =
          std::max(max_err, std::fabs(y[size_t(k)] - out->view().ptr<float>()[t * hidden + k]));
  }
  EXPECT_LT(max_err, 1e-5);

  // moe_experts_add (the shared experts' output added; out may alias add): the same sums plus
  // add, exactly (the default is moe_experts, then add).
  auto shared = randv(size_t(tokens * hidden));
  auto acc = be->upload(Tensor::make(shared.data(), DType::kF32, {tokens, hidden}), DType::kF32);
  be->moe_experts_add(*xt, w, *idt, *wt, *acc, *acc);
  for (int i = 0; i < tokens * hidden; ++i)
    ASSERT_EQ(acc->view().ptr<float>()[i], shared[size_t(i)] + out->view().ptr<float>()[i]) << i;
}

}  // namespace
}  // namespace strata
