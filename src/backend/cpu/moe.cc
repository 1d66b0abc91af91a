// Mixture-of-experts routing and expert compute on the CPU reference: Hugging Face transformers'
// DeepSeek-V2/V3 semantics, one token at a time for routing and one GEMM pair per hit expert.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/thread_pool.h"

namespace strata::cpu {
namespace {

// Indices of the k largest values, best first; ties go to the lower index (as torch.topk on
// CPU does in practice).
void top_k_indices(const float* v, int n, int k, std::vector<int>& idx) {
  idx.resize(size_t(n));
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                    [&](int a, int b) { return v[a] > v[b] || (v[a] == v[b] && a < b); });
  idx.resize(size_t(k));
}

// One token: scores from logits, the choice (scores + bias, group-limited), then weights.
void route_token(const float* logits, const float* bias, const MoeRouteArgs& a, int32_t* ids,
                 float* weights) {
  const int e_count = a.num_experts;
  std::vector<float> scores(static_cast<size_t>(e_count)), choice(static_cast<size_t>(e_count));
  if (a.scoring == MoeScoring::kSigmoid) {
    for (int e = 0; e < e_count; ++e) scores[size_t(e)] = 1.0f / (1.0f + std::exp(-logits[e]));
  } else {
    const float mx = *std::max_element(logits, logits + e_count);
    double sum = 0;
    for (int e = 0; e < e_count; ++e) sum += scores[size_t(e)] = std::exp(logits[e] - mx);
    for (float& s : scores) s = float(s / sum);
  }
  for (int e = 0; e < e_count; ++e) choice[size_t(e)] = scores[size_t(e)] + (bias ? bias[e] : 0.0f);

  std::vector<int> idx;
  if (a.num_groups > 1 && a.topk_groups < a.num_groups) {
    const int per_group = e_count / a.num_groups;
    std::vector<float> group_scores(static_cast<size_t>(a.num_groups));
    for (int g = 0; g < a.num_groups; ++g) {
      const float* c = choice.data() + g * per_group;
      if (a.group_score == MoeGroupScore::kMax) {
        group_scores[size_t(g)] = *std::max_element(c, c + per_group);
      } else {
        top_k_indices(c, per_group, std::min(2, per_group), idx);
        float s = 0;
        for (int i : idx) s += c[i];
        group_scores[size_t(g)] = s;
      }
    }
    top_k_indices(group_scores.data(), a.num_groups, a.topk_groups, idx);
    std::vector<bool> keep(static_cast<size_t>(a.num_groups), false);
    for (int g : idx) keep[size_t(g)] = true;
    // Experts of the other groups can never be picked (transformers 5 masks them to -inf).
    for (int e = 0; e < e_count; ++e)
      if (!keep[size_t(e / per_group)]) choice[size_t(e)] = -INFINITY;
  }
  top_k_indices(choice.data(), e_count, a.top_k, idx);
  float sum = 0;
  for (int j = 0; j < a.top_k; ++j) {
    ids[j] = idx[size_t(j)];
    weights[j] = scores[size_t(idx[size_t(j)])];
    sum += weights[j];
  }
  for (int j = 0; j < a.top_k; ++j) {
    if (a.normalize) weights[j] /= sum + 1e-20f;
    weights[j] *= a.scaling_factor;
  }
}

}  // namespace

void CpuBackend::moe_route(const Tensor& router_logits, const Tensor& correction_bias,
                           const MoeRouteArgs& args, const Tensor& topk_ids,
                           const Tensor& topk_weights) {
  const int64_t tokens = router_logits.dim(0);
  CHECK_EQ(router_logits.dim(1), args.num_experts);
  CHECK(args.top_k > 0 && args.top_k <= args.num_experts);
  CHECK(args.num_groups > 0 && args.num_experts % args.num_groups == 0);
  CHECK(args.topk_groups > 0 && args.topk_groups <= args.num_groups);
  CHECK_EQ(topk_ids.numel(), tokens * args.top_k);
  CHECK_EQ(topk_weights.numel(), tokens * args.top_k);
  CHECK(topk_ids.dtype == DType::kI32);
  if (!correction_bias.empty()) CHECK_EQ(correction_bias.numel(), args.num_experts);
  const float* bias = correction_bias.empty() ? nullptr : correction_bias.ptr<float>();
  parallel_for(tokens, 16, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t)
      route_token(router_logits.ptr<float>() + t * args.num_experts, bias, args,
                  topk_ids.ptr<int32_t>() + t * args.top_k,
                  topk_weights.ptr<float>() + t * args.top_k);
  });
}

void CpuBackend::moe_experts(const Tensor& x, const MoeExpertWeights& experts,
                             const Tensor& topk_ids, const Tensor& topk_weights,
                             const Tensor& out) {
  const int64_t tokens = x.dim(0), hidden = experts.hidden(), inter = experts.inter();
  const int64_t n_experts = experts.num_experts(), top_k = topk_ids.dim(1);
  CHECK_EQ(x.dim(1), hidden);
  CHECK_EQ(out.numel(), tokens * hidden);
  CHECK_EQ(topk_ids.dim(0), tokens);
  const int32_t* ids = topk_ids.ptr<int32_t>();
  const float* w = topk_weights.ptr<float>();
  // (token, weight) lists per expert, in token order.
  std::vector<std::vector<std::pair<int64_t, float>>> routed(static_cast<size_t>(n_experts));
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t j = 0; j < top_k; ++j) {
      const int32_t e = ids[t * top_k + j];
      CHECK_MSG(e >= 0 && e < n_experts, "moe_experts: expert id {} of {}", e, n_experts);
      routed[size_t(e)].push_back({t, w[t * top_k + j]});
    }
  float* po = out.ptr<float>();
  std::memset(po, 0, size_t(tokens * hidden) * sizeof(float));
  std::vector<float> xs, gu, act, ys;
  const float* gate_up = experts.gate_up.weight->view().ptr<float>();
  const float* down = experts.down.weight->view().ptr<float>();
  // Experts in index order, each adding its weighted output (transformers' accumulation order).
  for (int64_t e = 0; e < n_experts; ++e) {
    const auto& list = routed[size_t(e)];
    const int64_t n = int64_t(list.size());
    if (n == 0) continue;
    xs.resize(size_t(n * hidden));
    gu.resize(size_t(n * 2 * inter));
    act.resize(size_t(n * inter));
    ys.resize(size_t(n * hidden));
    for (int64_t r = 0; r < n; ++r)
      std::memcpy(xs.data() + r * hidden, x.ptr<float>() + list[size_t(r)].first * hidden,
                  size_t(hidden) * sizeof(float));
    gemm_nt(n, 2 * inter, hidden, xs.data(), hidden, gate_up + e * 2 * inter * hidden, hidden,
            gu.data(), 2 * inter);
    for (int64_t r = 0; r < n; ++r) {
      const float *g = gu.data() + r * 2 * inter, *u = g + inter;
      for (int64_t i = 0; i < inter; ++i)
        act[size_t(r * inter + i)] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
    }
    gemm_nt(n, hidden, inter, act.data(), inter, down + e * hidden * inter, inter, ys.data(),
            hidden);
    for (int64_t r = 0; r < n; ++r) {
      const auto [t, wt] = list[size_t(r)];
      for (int64_t i = 0; i < hidden; ++i) po[t * hidden + i] += wt * ys[size_t(r * hidden + i)];
    }
  }
}

}  // namespace strata::cpu
