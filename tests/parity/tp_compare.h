// What the tensor-parallel parity tests compare (tp_parity_test.cc: tp N against tp 1;
// dcp_tp_parity_test.cc: decode context parallelism on NCCL ranks against tp 1): NMSE over the
// rows a comparison keeps, the rows whose MoE routing is a float32 near-tie (rounding may route
// them differently at any tp), and argmax agreement.
#pragma once

#include <algorithm>
#include <cmath>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "arch/model.h"
#include "core/check.h"
#include "model/config.h"
#include "model/weights.h"
#include "support/golden.h"

namespace strata::testing {

// NMSE over the rows (of width `vocab`) not marked in `skip` (all rows when skip is empty).
inline double nmse_of(const std::vector<float>& a, const std::vector<float>& b, int64_t vocab = 1,
                      const std::vector<bool>& skip = {}) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (!skip.empty() && skip[i / size_t(vocab)]) continue;
    num += double(a[i] - b[i]) * (a[i] - b[i]);
    den += double(b[i]) * b[i];
  }
  return den > 0 ? num / den : num;
}

// Rows whose expert choice is a near-tie in the float32 CPU model: in some MoE layer the last
// chosen group or expert beats the first one left out by less than `tie` (in routing-score
// units: sigmoid scores plus correction bias, or softmax probabilities). bf16 carries 8
// significant bits, so a hidden state's rounding moves a score near 0.5 by ~1e-3 and can pick
// other experts for such a token — its logits then differ by far more than bf16 noise, at tp 1
// as at tp N. The bounds below leave these rows out (a sharding bug would move every row).
inline std::vector<bool> near_tie_rows(const ModelSpec& spec, const WeightStore& weights,
                                       const std::vector<int32_t>& ids, double tie) {
  std::vector<bool> tied(ids.size(), false);
  const MoeSpec& m = spec.moe;
  if (m.n_routed_experts == 0) return tied;
  auto cpu = make_cpu_backend();
  auto model = create_model(spec, weights, *cpu);
  CHECK_MSG(model.ok(), "{}", model.status().to_string());
  const int e = m.n_routed_experts, k = m.num_experts_per_tok;
  const bool grouped = m.topk_method != TopkMethod::kGreedy && m.n_group > 1;
  const int groups = grouped ? m.n_group : 1, pick_groups = grouped ? m.topk_group : 1,
            per = e / groups;
  (*model)->set_tracer([&](std::string_view name, int layer, const Tensor& t) {
    if (name != "router_logits") return;
    auto bias = weights.load_f32("model.layers." + std::to_string(layer) +
                                 ".mlp.gate.e_score_correction_bias");
    for (size_t row = 0; row < ids.size(); ++row) {
      const float* x = t.ptr<float>() + row * size_t(e);
      std::vector<double> score(static_cast<size_t>(e));
      double total = 0, top = *std::max_element(x, x + e);
      for (int j = 0; j < e; ++j) {
        score[size_t(j)] = m.scoring_func == ScoringFunc::kSigmoid
                               ? 1 / (1 + std::exp(-double(x[j])))
                               : std::exp(double(x[j]) - top);
        total += score[size_t(j)];
      }
      for (int j = 0; j < e; ++j) {
        if (m.scoring_func != ScoringFunc::kSigmoid) score[size_t(j)] /= total;
        if (bias.ok()) score[size_t(j)] += bias->f32()[j];
      }
      double margin = INFINITY;
      std::vector<int> candidates;
      if (groups > 1) {  // groups ranked by their best two scores (noaux_tc) or best one
        std::vector<std::pair<double, int>> g;
        for (int q = 0; q < groups; ++q) {
          std::vector<double> in(score.begin() + q * per, score.begin() + (q + 1) * per);
          std::sort(in.rbegin(), in.rend());
          g.push_back(
              {m.topk_method == TopkMethod::kNoauxTc && per > 1 ? in[0] + in[1] : in[0], q});
        }
        std::sort(g.rbegin(), g.rend());
        margin = g[size_t(pick_groups - 1)].first - g[size_t(pick_groups)].first;
        for (int q = 0; q < pick_groups; ++q)
          for (int j = 0; j < per; ++j) candidates.push_back(g[size_t(q)].second * per + j);
      } else {
        for (int j = 0; j < e; ++j) candidates.push_back(j);
      }
      std::vector<double> c;
      for (int j : candidates) c.push_back(score[size_t(j)]);
      std::sort(c.rbegin(), c.rend());
      if (int(c.size()) > k) margin = std::min(margin, c[size_t(k - 1)] - c[size_t(k)]);
      if (margin < tie) tied[row] = true;
    }
  });
  SingleSequence seq(**model, 16, int(ids.size()));
  seq.step(ids, true);
  return tied;
}

inline double agreement(const std::vector<float>& a, const std::vector<float>& b, int64_t vocab) {
  const int64_t rows = int64_t(a.size()) / vocab;
  int64_t same = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const auto ra = a.begin() + r * vocab, rb = b.begin() + r * vocab;
    same += (std::max_element(ra, ra + vocab) - ra) == (std::max_element(rb, rb + vocab) - rb);
  }
  return rows > 0 ? double(same) / double(rows) : 1.0;
}

}  // namespace strata::testing
