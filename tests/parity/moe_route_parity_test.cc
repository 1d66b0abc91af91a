// Mixture-of-experts routing on the GPU (backend/cuda/moe_route.h, moe_experts.h's plan) against
// the CPU twin (cpu::CpuBackend::moe_route, backend/cpu/moe.cc) and host references, on raw
// device buffers, odd sizes: router logits, the top-k route, and the plan that permutes the
// assignments into per-expert segments and tiles.
//
// References and bounds:
// - router logits: float64 x · Wᵀ of the same bf16 values; float32 accumulation in a different
//   order: relative error ~k · 2⁻²⁴ at worst, NMSE bound 1e-10 (a wrong row, token or k chunk
//   gives ~1). The same launch twice gives the same bits (the split sums are ordered).
// - route: the CPU twin on the same float32 logits. ids must be equal, except at near-ties:
//   a token whose choice differs is accepted only if the CPU-side margin at one of its
//   decisions (between consecutive ranked experts in the top k + 1, or groups in the top
//   topk_groups + 1), recomputed in float64, is below 1e-5 (the device's expf differs from the
//   host's by an ulp or two: score differences of a few 1e-8) and above 0 (exact ties, as made
//   by logits on a 0.5 grid, must break alike: to the lower id on both sides). They are counted
//   and printed, and must stay under 1% of the tokens. Weights of equal choices: relative 1e-5.
// - plan: offsets, permuted rows, tokens, active list and tile list checked against their
//   definitions (ids outside [0, E) included).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/moe_route.h"
#include "parity/moe_device.h"

namespace strata::parity {
namespace {

// ---- router logits ----
TEST(MoeParity, RouterLogits) {
  Stream s;
  std::mt19937 rng(5);
  for (auto [experts, hidden] :
       std::vector<std::pair<int64_t, int64_t>>{{8, 320}, {64, 2048}, {384, 7168}, {72, 320}})
    for (int64_t tokens : {1, 3, 8, 13, 32}) {
      const auto x = random_bf16(rng, tokens * hidden, 1.0f);
      const auto w = random_bf16(rng, experts * hidden, 0.02f);
      auto dx = upload(to_bits(x), s), dw = upload(to_bits(w), s);
      std::vector<double> want(size_t(tokens * experts));
      for (int64_t t = 0; t < tokens; ++t)
        for (int64_t e = 0; e < experts; ++e) {
          double acc = 0;
          for (int64_t i = 0; i < hidden; ++i)
            acc += double(x[size_t(t * hidden + i)]) * double(w[size_t(e * hidden + i)]);
          want[size_t(t * experts + e)] = acc;
        }
      const size_t partial_bytes = cuda::moe_router_partials_bytes(tokens, experts, hidden);
      Dev out(size_t(tokens * experts) * 4), partials(partial_bytes),
          counters(cuda::moe_router_counter_bytes(experts));
      CUDA_CHECK(cudaMemsetAsync(counters.as<void>(), 0, counters.bytes(), s.get()));
      std::vector<float> preload_off;  // splits 0's logits without the preload: the same bits
      for (auto [splits, preload] : {std::pair{0, 0}, std::pair{1, 0}, std::pair{0, 1}}) {
        cuda::MoeRouterParams p{};
        p.preload = preload;
        p.x = dx->as<bf16_bits>();
        p.w = dw->as<bf16_bits>();
        p.out = out.as<float>();
        p.partials = partials.as<float>();
        p.counters = counters.as<int32_t>();
        p.tokens = tokens;
        p.experts = experts;
        p.hidden = hidden;
        p.splits = splits;
        std::vector<float> first;
        for (int rep = 0; rep < 2; ++rep) {
          CUDA_CHECK(cudaMemsetAsync(out.as<void>(), 0xff, out.bytes(), s.get()));
          cuda::launch_moe_router(p, s.get());
          const auto got = download<float>(out.as<void>(), size_t(tokens * experts), s);
          const double e = nmse(got, want);
          EXPECT_LT(e, 1e-10) << "router E " << experts << " H " << hidden << " T " << tokens
                              << " splits " << splits;
          if (rep == 0)
            first = got;
          else
            EXPECT_EQ(0, std::memcmp(first.data(), got.data(), got.size() * 4))
                << "router not deterministic, E " << experts << " T " << tokens;
        }
        if (splits == 0 && !preload) preload_off = first;
        if (preload)
          EXPECT_EQ(0, std::memcmp(first.data(), preload_off.data(), first.size() * 4))
              << "router with its weights preloaded, E " << experts << " T " << tokens;
      }
      // The counters are left zero for the next launch.
      const auto cnt = download<int32_t>(counters.as<void>(), size_t((experts + 15) / 16), s);
      for (int32_t c : cnt) EXPECT_EQ(c, 0);
    }
}

// ---- route ----
struct RouteCase {
  const char* name;
  int experts, top_k, groups, topk_groups;
  MoeScoring scoring;
  MoeGroupScore group_score;
  bool normalize, bias;
  float scaling;
};
const RouteCase kRouteCases[] = {
    {"v2-lite softmax", 64, 6, 1, 1, MoeScoring::kSoftmax, MoeGroupScore::kMax, false, false, 1.0f},
    {"v2 grouped softmax", 64, 6, 8, 3, MoeScoring::kSoftmax, MoeGroupScore::kMax, true, false,
     16.0f},
    {"v3 noaux_tc", 256, 8, 8, 4, MoeScoring::kSigmoid, MoeGroupScore::kTop2Sum, true, true, 2.5f},
    {"kimi", 384, 8, 1, 1, MoeScoring::kSigmoid, MoeGroupScore::kTop2Sum, true, true, 2.827f},
    {"small", 8, 2, 2, 1, MoeScoring::kSigmoid, MoeGroupScore::kTop2Sum, false, true, 1.0f},
    {"one per group", 16, 3, 16, 5, MoeScoring::kSoftmax, MoeGroupScore::kTop2Sum, true, false,
     1.0f},
};

// The smallest gap between consecutive ranked values among the top `n + 1` of `v` (float64):
// a choice that differs is a near-tie only if one of its decisions had such a small margin.
double ranked_margin(std::vector<double> v, int n) {
  std::sort(v.begin(), v.end(), std::greater<double>());
  double m = INFINITY;
  for (int i = 0; i < n && i + 1 < int(v.size()); ++i)
    if (std::isfinite(v[size_t(i)]) && std::isfinite(v[size_t(i + 1)]))
      m = std::min(m, v[size_t(i)] - v[size_t(i + 1)]);
  return m;
}
// The CPU side's decision margins of one token, recomputed in float64 from its logits.
double route_margin(const float* logits, const float* bias, const RouteCase& c) {
  const int e_count = c.experts;
  std::vector<double> score(static_cast<size_t>(e_count)), choice(static_cast<size_t>(e_count));
  if (c.scoring == MoeScoring::kSigmoid) {
    for (int e = 0; e < e_count; ++e) score[size_t(e)] = 1.0 / (1.0 + std::exp(-double(logits[e])));
  } else {
    double mx = -INFINITY, sum = 0;
    for (int e = 0; e < e_count; ++e) mx = std::max(mx, double(logits[e]));
    for (int e = 0; e < e_count; ++e) sum += score[size_t(e)] = std::exp(double(logits[e]) - mx);
    for (double& s : score) s /= sum;
  }
  for (int e = 0; e < e_count; ++e) choice[size_t(e)] = score[size_t(e)] + (bias ? bias[e] : 0.0);
  double margin = INFINITY;
  if (c.groups > 1 && c.topk_groups < c.groups) {
    const int per = e_count / c.groups;
    std::vector<double> gs(static_cast<size_t>(c.groups));
    for (int g = 0; g < c.groups; ++g) {
      std::vector<double> v(choice.begin() + g * per, choice.begin() + (g + 1) * per);
      std::sort(v.begin(), v.end(), std::greater<double>());
      gs[size_t(g)] = c.group_score == MoeGroupScore::kMax ? v[0] : (per > 1 ? v[0] + v[1] : v[0]);
    }
    margin = std::min(margin, ranked_margin(gs, c.topk_groups));
    std::vector<double> order(gs);
    std::sort(order.begin(), order.end(), std::greater<double>());
    const double cut = order[size_t(c.topk_groups - 1)];
    for (int e = 0; e < e_count; ++e)
      if (gs[size_t(e / per)] < cut) choice[size_t(e)] = -INFINITY;
  }
  return std::min(margin, ranked_margin(choice, c.top_k));
}

TEST(MoeParity, RouteMatchesCpu) {
  Stream s;
  std::mt19937 rng(7);
  cpu::CpuBackend cpu;
  for (const RouteCase& c : kRouteCases)
    for (bool ties : {false, true})
      for (int64_t tokens : {1, 17, 300}) {
        const int e_count = c.experts, k = c.top_k;
        std::normal_distribution<float> nd(0.0f, 2.0f);
        std::vector<float> logits(size_t(tokens * e_count)), bias(static_cast<size_t>(e_count));
        for (float& v : logits) v = ties ? std::round(nd(rng) * 2.0f) / 2.0f : nd(rng);
        for (float& v : bias) v = ties ? 0.0f : 0.1f * nd(rng);
        HostTensor hl(DType::kF32, {tokens, e_count}), hb(DType::kF32, {e_count});
        std::memcpy(hl.f32(), logits.data(), logits.size() * 4);
        std::memcpy(hb.f32(), bias.data(), bias.size() * 4);
        HostTensor ids(DType::kI32, {tokens, k}), wts(DType::kF32, {tokens, k});
        const MoeRouteArgs args{.num_experts = e_count,
                                .top_k = k,
                                .num_groups = c.groups,
                                .topk_groups = c.topk_groups,
                                .scoring = c.scoring,
                                .group_score = c.group_score,
                                .normalize = c.normalize,
                                .scaling_factor = c.scaling};
        cpu.moe_route(hl.view, c.bias ? hb.view : Tensor{}, args, ids.view, wts.view);

        auto dl = upload(logits, s), db = upload(bias, s);
        Dev d_ids(size_t(tokens * k) * 4), d_w(size_t(tokens * k) * 4);
        CUDA_CHECK(cudaMemsetAsync(d_ids.as<void>(), 0xff, d_ids.bytes(), s.get()));
        CUDA_CHECK(cudaMemsetAsync(d_w.as<void>(), 0xff, d_w.bytes(), s.get()));
        cuda::MoeRouteParams p{};
        p.logits = dl->as<float>();
        p.bias = c.bias ? db->as<float>() : nullptr;
        p.topk_ids = d_ids.as<int32_t>();
        p.topk_weights = d_w.as<float>();
        p.tokens = tokens;
        p.num_experts = e_count;
        p.top_k = k;
        p.num_groups = c.groups;
        p.topk_groups = c.topk_groups;
        p.scoring = c.scoring == MoeScoring::kSigmoid ? cuda::kMoeSigmoid : cuda::kMoeSoftmax;
        p.group_score =
            c.group_score == MoeGroupScore::kMax ? cuda::kMoeGroupMax : cuda::kMoeGroupTop2Sum;
        p.normalize = c.normalize;
        p.scaling_factor = c.scaling;
        cuda::launch_moe_route(p, s.get());
        const auto got_ids = download<int32_t>(d_ids.as<void>(), size_t(tokens * k), s);
        const auto got_w = download<float>(d_w.as<void>(), size_t(tokens * k), s);
        int near_ties = 0;
        for (int64_t t = 0; t < tokens; ++t) {
          const int32_t* want_ids = ids.view.ptr<int32_t>() + t * k;
          const float* want_w = wts.f32() + t * k;
          bool same = true;
          for (int j = 0; j < k; ++j) same &= got_ids[size_t(t * k + j)] == want_ids[j];
          if (!same) {
            const double margin =
                route_margin(&logits[size_t(t * e_count)], c.bias ? bias.data() : nullptr, c);
            EXPECT_GT(margin, 0.0) << c.name << ": exact ties must break alike, token " << t;
            EXPECT_LT(margin, 1e-5) << c.name << ": token " << t << " chose differently";
            ++near_ties;
            continue;
          }
          for (int j = 0; j < k; ++j)
            EXPECT_NEAR(got_w[size_t(t * k + j)], want_w[j], 1e-5 * std::fabs(want_w[j]) + 1e-7)
                << c.name << " token " << t << " slot " << j;
        }
        EXPECT_LE(near_ties, std::max<int64_t>(1, tokens / 100)) << c.name;
        std::printf("route %-18s ties %d T %3lld: near-ties %d\n", c.name, int(ties),
                    static_cast<long long>(tokens), near_ties);
      }
}

// ---- plan ----
TEST(MoeParity, Plan) {
  Stream s;
  std::mt19937 rng(9);
  for (int experts : {8, 64, 1024})
    for (int k : {1, 6})
      for (int64_t tokens : {1, 5, 300, 3000, 9000})  // 3000 · 6 and 9000: the multi-CTA plan
        for (int tile_rows : {0, 64, 128}) {
          const int64_t n = tokens * k;
          std::vector<int32_t> ids(static_cast<size_t>(n));
          // Skewed: half the experts never chosen, a few ids out of range.
          std::uniform_int_distribution<int> pick(0, std::max(1, experts / 2) - 1);
          for (auto& v : ids) v = rng() % 97 == 0 ? (rng() % 2 ? -1 : experts) : pick(rng) * 2;
          auto d_ids = upload(ids, s);
          const int64_t max_tiles = cuda::moe_max_tiles(n, experts, 64);
          Dev offsets(size_t(experts + 1) * 4), pos(size_t(n) * 4), row_token(size_t(n) * 4),
              active(size_t(experts) * 4), counts(8), tiles(size_t(max_tiles) * 8),
              block_counts(size_t(cuda::moe_plan_blocks(n) * experts) * 4);
          // Poisoned: the multi-CTA plan must not depend on its scratch's contents.
          CUDA_CHECK(cudaMemsetAsync(block_counts.as<void>(), 0x7f, block_counts.bytes(), s.get()));
          cuda::MoePlanParams p{};
          p.topk_ids = d_ids->as<int32_t>();
          p.plan = {offsets.as<int32_t>(),
                    pos.as<int32_t>(),
                    row_token.as<int32_t>(),
                    active.as<int32_t>(),
                    counts.as<int32_t>(),
                    tiles.as<int32_t>(),
                    cuda::moe_plan_blocks(n) > 0 ? block_counts.as<int32_t>() : nullptr};
          p.assignments = n;
          p.top_k = k;
          p.num_experts = experts;
          p.tile_rows = tile_rows;
          cuda::launch_moe_plan(p, s.get());
          const auto g_off = download<int32_t>(offsets.as<void>(), size_t(experts + 1), s);
          const auto g_pos = download<int32_t>(pos.as<void>(), size_t(n), s);
          const auto g_tok = download<int32_t>(row_token.as<void>(), size_t(n), s);
          const auto g_act = download<int32_t>(active.as<void>(), size_t(experts), s);
          const auto g_cnt = download<int32_t>(counts.as<void>(), 2, s);
          const auto g_tiles = download<int32_t>(tiles.as<void>(), size_t(2 * max_tiles), s);
          std::vector<int64_t> count(static_cast<size_t>(experts), 0);
          for (int32_t e : ids)
            if (e >= 0 && e < experts) ++count[size_t(e)];
          const std::string what = "E " + std::to_string(experts) + " k " + std::to_string(k) +
                                   " T " + std::to_string(tokens) + " tile " +
                                   std::to_string(tile_rows);
          int64_t at = 0, active_n = 0, tiles_n = 0;
          bool ok = true;
          for (int e = 0; e < experts; ++e) {
            ok &= g_off[size_t(e)] == at;
            if (count[size_t(e)] > 0) {
              ok &= g_act[size_t(active_n)] == e;
              ++active_n;
              if (tile_rows > 0)
                for (int64_t r = 0; r < count[size_t(e)]; r += tile_rows) {
                  ok &= g_tiles[size_t(2 * tiles_n)] == e &&
                        g_tiles[size_t(2 * tiles_n + 1)] == at + r;
                  ++tiles_n;
                }
            }
            at += count[size_t(e)];
          }
          ok &= g_off[size_t(experts)] == at && g_cnt[0] == active_n && g_cnt[1] == tiles_n;
          EXPECT_TRUE(ok) << "offsets / active / tiles, " << what;
          std::vector<bool> seen(static_cast<size_t>(at), false);
          int64_t bad = 0;
          for (int64_t i = 0; i < n; ++i) {
            const int e = ids[size_t(i)];
            const int r = g_pos[size_t(i)];
            if (e < 0 || e >= experts) {
              bad += r != -1;
              continue;
            }
            if (r < g_off[size_t(e)] || r >= g_off[size_t(e + 1)] || seen[size_t(r)]) {
              ++bad;
              continue;
            }
            seen[size_t(r)] = true;
            bad += g_tok[size_t(r)] != i / k;
          }
          EXPECT_EQ(bad, 0) << "positions / tokens, " << what;
        }
}

}  // namespace
}  // namespace strata::parity
