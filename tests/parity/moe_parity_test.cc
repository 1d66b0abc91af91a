// Mixture-of-experts on the GPU (backend/cuda/moe_route.h, moe_experts.h) against the CPU twin
// (cpu::CpuBackend::moe_route / moe_experts, backend/cpu/moe.cc) and host references, on raw
// device buffers, odd sizes.
//
// References and bounds:
// - repack (bf16, fp8 tile layouts): rebuilt here from moe_experts.cuh's documentation, byte
//   for byte.
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
// - experts (every format, both regimes): the CPU twin with the same weights (dequantized on the
//   host by core/weight_format's reference, the values the kernels compute with, bit for bit),
//   x the same bf16 values. The GPU rounds gate and up to bf16 before silu, then act, each
//   expert's output y and the final sum: four bf16 roundings (2⁻⁹ relative at worst, ~1.1e-3
//   RMS each), which propagate to an NMSE of ~6e-6; bound 4e-5. A wrong row, expert, tile or
//   scale gives 1e-2 to 2; an output never written keeps its NaN poison (infinite NMSE), and a
//   poisoned guard after the output must survive. The same layer twice gives the same bits
//   (rows inside an expert's segment are placed by atomics; values must not depend on it).
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
#include "backend/cuda/linear_int4.h"
#include "backend/cuda/moe_experts.h"
#include "backend/cuda/moe_route.h"
#include "core/dtype.h"
#include "core/weight_format.h"
#include "parity/moe_stack.h"

namespace strata {
namespace {

using cuda::bf16_bits;

constexpr int64_t kGuard = 256;  // poisoned bf16 values after every expert output

class Dev {  // a device allocation, freed at scope exit
 public:
  explicit Dev(size_t bytes) : bytes_(bytes) { CUDA_CHECK(cudaMalloc(&p_, bytes ? bytes : 16)); }
  ~Dev() { cudaFree(p_); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(p_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* p_ = nullptr;
  size_t bytes_;
};

class Stream {
 public:
  Stream() { CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
  ~Stream() { cudaStreamDestroy(s_); }
  cudaStream_t get() const { return s_; }
  void sync() const { CUDA_CHECK(cudaStreamSynchronize(s_)); }

 private:
  cudaStream_t s_;
};

template <class T>
std::unique_ptr<Dev> upload(const std::vector<T>& v, const Stream& s) {
  auto d = std::make_unique<Dev>(v.size() * sizeof(T));
  CUDA_CHECK(cudaMemcpyAsync(d->template as<void>(), v.data(), v.size() * sizeof(T),
                             cudaMemcpyHostToDevice, s.get()));
  s.sync();
  return d;
}
std::unique_ptr<Dev> upload_bytes(const std::vector<uint8_t>& v, const Stream& s) {
  return upload(v, s);
}
template <class T>
std::vector<T> download(const void* d, size_t count, const Stream& s) {
  std::vector<T> v(count);
  s.sync();
  CUDA_CHECK(cudaMemcpyAsync(v.data(), d, count * sizeof(T), cudaMemcpyDeviceToHost, s.get()));
  s.sync();
  return v;
}

std::vector<float> random_bf16(std::mt19937& rng, int64_t count, float scale) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(count));
  for (float& x : v) x = round_to_bf16(d(rng));
  return v;
}
std::vector<uint16_t> to_bits(const std::vector<float>& v) {
  std::vector<uint16_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = f32_to_bf16(v[i]);
  return b;
}

double nmse(const std::vector<float>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double g = got[i];
    if (!std::isfinite(g)) return INFINITY;
    num += (g - want[i]) * (g - want[i]);
    den += want[i] * want[i];
  }
  return den > 0 ? num / den : num;
}

// ---- the tile layouts, rebuilt from moe_experts.cuh's documentation ----
// Tiles of 16 rows x TK columns (bf16 16, fp8 32), [row tile][k tile], 512 bytes; lane l = 4g + c
// owns bytes 16l..16l+15 = its A fragments of the tile's k16 steps s, j = 16s + 2c:
//   bf16: words a0 = W[g][j], W[g][j+1]; a1 = W[g+8][j], W[g+8][j+1]; a2 = W[g][j+8], W[g][j+9];
//         a3 = W[g+8][j+8], W[g+8][j+9] (lower column in the lower half).
//   fp8:  word 2s = bytes W[g][j], W[g][j+1], W[g+8][j], W[g+8][j+1]; word 2s + 1 the same at
//         j + 8, j + 9. Columns past k are zero.
std::vector<uint8_t> host_tiles(const std::vector<uint8_t>& src, int elem, int64_t rows,
                                int64_t k) {
  const int tk = elem == 2 ? 16 : 32;
  const int64_t kts = (k + tk - 1) / tk;
  std::vector<uint8_t> out(size_t(rows / 16 * kts * 512), 0);
  for (int64_t rt = 0; rt < rows / 16; ++rt)
    for (int64_t kt = 0; kt < kts; ++kt)
      for (int lane = 0; lane < 32; ++lane) {
        const int g = lane / 4, c = lane % 4;
        uint8_t* dst = &out[size_t(((rt * kts + kt) * 32 + lane) * 16)];
        auto put = [&](int at, int r, int col) {  // element `at` of the lane's 16 bytes
          const int64_t cc = kt * tk + col;
          if (cc >= k) return;
          std::memcpy(dst + at * elem, &src[size_t(((rt * 16 + r) * k + cc) * elem)], size_t(elem));
        };
        if (elem == 2) {
          const int j = 2 * c;
          const int rr[4] = {g, g + 8, g, g + 8}, cc[4] = {j, j, j + 8, j + 8};
          for (int w = 0; w < 4; ++w) {
            put(2 * w, rr[w], cc[w]);
            put(2 * w + 1, rr[w], cc[w] + 1);
          }
        } else {
          for (int s = 0; s < 2; ++s) {
            const int j = 16 * s + 2 * c;
            for (int upper = 0; upper < 2; ++upper) {
              const int at = 8 * s + 4 * upper, col = j + 8 * upper;
              put(at, g, col);
              put(at + 1, g, col + 1);
              put(at + 2, g + 8, col);
              put(at + 3, g + 8, col + 1);
            }
          }
        }
      }
  return out;
}

TEST(MoeParity, RepackLayouts) {
  Stream s;
  std::mt19937 rng(3);
  for (int elem : {2, 1})
    for (auto [rows, k] :
         std::vector<std::pair<int64_t, int64_t>>{{16, 16}, {64, 320}, {48, 80}, {32, 2048}}) {
      std::vector<uint8_t> src(size_t(rows * k * elem));
      for (auto& b : src) b = uint8_t(rng());
      auto d_src = upload_bytes(src, s);
      const int format = elem == 2 ? cuda::kMoeBf16 : cuda::kMoeFp8;
      const int64_t bytes = cuda::moe_values_bytes(format, rows, k);
      Dev dst(static_cast<size_t>(bytes));
      CUDA_CHECK(cudaMemsetAsync(dst.as<void>(), 0x5a, size_t(bytes), s.get()));
      cuda::MoeRepackParams p{};
      p.src = d_src->as<void>();
      p.dst = dst.as<void>();
      p.rows = rows;
      p.k = k;
      p.format = format;
      cuda::launch_moe_repack(p, s.get());
      const auto want = host_tiles(src, elem, rows, k);
      ASSERT_EQ(int64_t(want.size()), bytes);
      const auto got = download<uint8_t>(dst.as<void>(), want.size(), s);
      int64_t bad = 0;
      for (size_t i = 0; i < want.size(); ++i) bad += got[i] != want[i];
      EXPECT_EQ(bad, 0) << (elem == 2 ? "bf16" : "fp8") << " rows " << rows << " k " << k;
    }
}

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
      for (int splits : {0, 1}) {
        cuda::MoeRouterParams p{};
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

// ---- experts ----
using parity::Fmt;
using parity::fmt_name;
using parity::random_stack;

// The stack on the device in the kernels' layout.
struct DevStack {
  std::unique_ptr<Dev> values, scales;
  cuda::MoeWeights view{};
};
DevStack to_device(const HostLinearWeight& w, Fmt f, const Stream& s) {
  DevStack d;
  const int64_t rows = w.stack * w.out;
  cuda::MoeWeights& v = d.view;
  v.n = w.out;
  v.k = w.in;
  if (f == Fmt::kInt4g32 || f == Fmt::kInt4g128) {
    v.format = cuda::kMoeInt4;
    v.group = w.format.group_size;
    v.values_stride = cuda::int4_packed_bytes(w.out, w.in);
    v.scales_stride = cuda::int4_scale_bytes(w.out, w.in, v.group);
    auto src_p = upload_bytes(w.values, s), src_s = upload_bytes(w.scales, s);
    d.values = std::make_unique<Dev>(size_t(cuda::int4_packed_bytes(rows, w.in)));
    d.scales = std::make_unique<Dev>(size_t(cuda::int4_scale_bytes(rows, w.in, v.group)));
    cuda::Int4RepackParams p{};
    p.src_packed = src_p->as<int32_t>();
    p.src_scale = src_s->as<bf16_bits>();
    p.dst_packed = d.values->as<void>();
    p.dst_scale = d.scales->as<bf16_bits>();
    p.n = rows;
    p.k = w.in;
    p.src_cols = w.in / 8;
    p.group = v.group;
    cuda::launch_int4_repack(p, s.get());
    s.sync();
  } else {
    v.format = f == Fmt::kBf16 ? cuda::kMoeBf16 : cuda::kMoeFp8;
    v.values_stride = cuda::moe_values_bytes(v.format, w.out, w.in);
    auto src = upload_bytes(w.values, s);
    d.values = std::make_unique<Dev>(size_t(v.values_stride * w.stack));
    cuda::MoeRepackParams p{};
    p.src = src->as<void>();
    p.dst = d.values->as<void>();
    p.rows = rows;
    p.k = w.in;
    p.format = v.format;
    cuda::launch_moe_repack(p, s.get());
    s.sync();
    if (f == Fmt::kFp8) {
      d.scales = upload_bytes(w.scales, s);
      v.scales_stride = cuda::moe_scale_bytes(v.format, w.out, w.in, 0);
    }
  }
  v.values = d.values->as<void>();
  v.scales = d.scales ? d.scales->as<void>() : nullptr;
  return d;
}

// The CPU twin's weight tensor: float32 [stack, out, in].
DeviceTensorPtr cpu_weight(cpu::CpuBackend& cpu, const HostLinearWeight& w) {
  auto t = cpu.alloc(DType::kF32, {w.stack, w.out, w.in});
  dequantize_linear(w, t->view().ptr<float>());
  return t;
}

struct ExpertCase {
  Fmt fmt;
  int64_t hidden, inter;
  int experts, top_k;
};
const ExpertCase kExpertCases[] = {
    {Fmt::kBf16, 320, 96, 8, 2},      {Fmt::kBf16, 320, 96, 64, 6},
    {Fmt::kInt4g32, 320, 96, 64, 8},  {Fmt::kInt4g32, 320, 96, 8, 8},
    {Fmt::kInt4g128, 384, 128, 8, 2}, {Fmt::kInt4g128, 384, 128, 64, 6},
    {Fmt::kFp8, 320, 128, 64, 8},     {Fmt::kFp8, 320, 128, 8, 2},
};

TEST(MoeParity, ExpertsMatchCpu) {
  Stream s;
  std::mt19937 rng(13);
  cpu::CpuBackend cpu;
  for (const ExpertCase& c : kExpertCases) {
    const int64_t hidden = c.hidden, inter = c.inter;
    const HostLinearWeight gu = random_stack(rng, c.fmt, c.experts, 2 * inter, hidden);
    const HostLinearWeight dn = random_stack(rng, c.fmt, c.experts, hidden, inter);
    DevStack d_gu = to_device(gu, c.fmt, s), d_dn = to_device(dn, c.fmt, s);
    MoeExpertWeights cw;
    cw.gate_up.weight = cpu_weight(cpu, gu);
    cw.gate_up.stack = c.experts;
    cw.down.weight = cpu_weight(cpu, dn);
    cw.down.stack = c.experts;
    for (int64_t tokens : {1, 5, 13, 33, 300}) {
      const int k = c.top_k;
      const auto x = random_bf16(rng, tokens * hidden, 1.0f);
      // Random distinct experts per token (with E = 64 and few tokens most experts get none),
      // positive weights.
      std::vector<int32_t> ids(size_t(tokens * k));
      std::vector<float> wts(size_t(tokens * k));
      std::uniform_real_distribution<float> wd(0.1f, 1.0f);
      for (int64_t t = 0; t < tokens; ++t) {
        std::vector<int32_t> all(static_cast<size_t>(c.experts));
        for (int e = 0; e < c.experts; ++e) all[size_t(e)] = e;
        std::shuffle(all.begin(), all.end(), rng);
        for (int j = 0; j < k; ++j) {
          ids[size_t(t * k + j)] = all[size_t(j)];
          wts[size_t(t * k + j)] = wd(rng);
        }
      }
      const bool with_add = tokens == 13;  // the fused shared-expert add
      const auto add = random_bf16(rng, tokens * hidden, 0.5f);
      // CPU twin.
      HostTensor hx(DType::kF32, {tokens, hidden}), hids(DType::kI32, {tokens, k}),
          hw(DType::kF32, {tokens, k}), ho(DType::kF32, {tokens, hidden});
      std::memcpy(hx.f32(), x.data(), x.size() * 4);
      std::memcpy(hids.view.ptr<int32_t>(), ids.data(), ids.size() * 4);
      std::memcpy(hw.f32(), wts.data(), wts.size() * 4);
      cpu.moe_experts(hx.view, cw, hids.view, hw.view, ho.view);
      std::vector<double> want(size_t(tokens * hidden));
      for (size_t i = 0; i < want.size(); ++i) want[i] = ho.f32()[i] + (with_add ? add[i] : 0.0f);

      auto dx = upload(to_bits(x), s), d_ids = upload(ids, s), d_w = upload(wts, s),
           d_add = upload(to_bits(add), s);
      for (int regime : {cuda::kMoeDecode, cuda::kMoePrefill}) {
        const size_t scratch_bytes =
            cuda::moe_experts_scratch_bytes(tokens, k, c.experts, hidden, inter);
        Dev scratch(scratch_bytes), out(size_t(tokens * hidden + kGuard) * 2);
        CUDA_CHECK(cudaMemsetAsync(scratch.as<void>(), 0xff, scratch_bytes, s.get()));
        std::vector<uint16_t> first;
        for (int rep = 0; rep < 2; ++rep) {
          CUDA_CHECK(cudaMemsetAsync(out.as<void>(), 0xff, out.bytes(), s.get()));
          cuda::MoeExpertsParams p{};
          p.x = dx->as<bf16_bits>();
          p.topk_ids = d_ids->as<int32_t>();
          p.topk_weights = d_w->as<float>();
          p.add = with_add ? d_add->as<bf16_bits>() : nullptr;
          p.out = out.as<bf16_bits>();
          p.scratch = scratch.as<void>();
          p.gate_up = d_gu.view;
          p.down = d_dn.view;
          p.tokens = tokens;
          p.top_k = k;
          p.num_experts = c.experts;
          p.regime = regime;
          cuda::launch_moe_experts(p, s.get());
          const auto all = download<uint16_t>(out.as<void>(), size_t(tokens * hidden + kGuard), s);
          bool guard = true;
          for (int64_t i = tokens * hidden; i < tokens * hidden + kGuard; ++i)
            guard &= all[size_t(i)] == 0xffff;
          std::vector<float> got(size_t(tokens * hidden));
          for (size_t i = 0; i < got.size(); ++i) got[i] = bf16_to_f32(all[i]);
          const double e = nmse(got, want);
          const char* rname = regime == cuda::kMoeDecode ? "decode" : "prefill";
          EXPECT_LT(e, 4e-5) << fmt_name(c.fmt) << " " << rname << " E " << c.experts << " k " << k
                             << " T " << tokens;
          EXPECT_TRUE(guard) << "wrote past the output: " << fmt_name(c.fmt) << " " << rname;
          if (rep == 0) {
            first.assign(all.begin(), all.begin() + tokens * hidden);
            std::printf("experts %-9s %-7s H %3lld I %3lld E %2d k %d T %3lld: NMSE %.2e\n",
                        fmt_name(c.fmt), rname, static_cast<long long>(hidden),
                        static_cast<long long>(inter), c.experts, k, static_cast<long long>(tokens),
                        e);
          } else {
            EXPECT_EQ(0, std::memcmp(first.data(), all.data(), first.size() * 2))
                << "not deterministic: " << fmt_name(c.fmt) << " " << rname << " T " << tokens;
          }
        }
      }
    }
  }
}

// ---- decode GEMV work decompositions ----
// Every forced (ksplit, cluster, tiles_per_warp) shape below that the launcher accepts for the
// sizes (and the automatic one), in grouped mode (gate_up, down and combine: the decode step's
// pieces, rows in assignment order) and in dense mode, against the CPU twin. hidden 2048 so that
// k splits of up to 8 warps x 8 CTAs fit gate_up; T 1, 12 and 20 use 1, 2 and 4 n-tiles; T 40 of
// one expert takes two passes of 32 rows.
struct GemvShapeCase {
  int ksplit, cluster, tiles_per_warp;
};
const GemvShapeCase kGemvShapes[] = {{0, 0, 0}, {1, 1, 1}, {1, 1, 2}, {1, 1, 8}, {2, 1, 1},
                                     {4, 1, 1}, {8, 1, 1}, {8, 2, 1}, {8, 4, 1}, {8, 8, 1}};

// Forces `sh` when it fits these parameters (else the automatic shape); returns whether forced.
bool force_shape(cuda::MoeGroupedParams& g, const GemvShapeCase& sh) {
  cuda::MoeGroupedParams t = g;
  t.ksplit = sh.ksplit;
  t.cluster = sh.cluster;
  t.tiles_per_warp = sh.tiles_per_warp;
  const cuda::MoeGemvShape got = cuda::moe_gemv_shape(t);
  if (got.ksplit == 0) {  // does not fit
    g.ksplit = g.cluster = g.tiles_per_warp = 0;
    return false;
  }
  if (sh.ksplit != 0) {
    EXPECT_EQ(got.ksplit, sh.ksplit);
    EXPECT_EQ(got.cluster, sh.cluster);
    EXPECT_EQ(got.tiles_per_warp, sh.tiles_per_warp);
  }
  g = t;
  return true;
}

TEST(MoeParity, GemvShapesMatchCpu) {
  Stream s;
  std::mt19937 rng(19);
  cpu::CpuBackend cpu;
  const int64_t hidden = 2048, inter = 256;
  const int experts = 16, k = 4;
  for (Fmt f : {Fmt::kBf16, Fmt::kFp8, Fmt::kInt4g32, Fmt::kInt4g128}) {
    const HostLinearWeight gu = random_stack(rng, f, experts, 2 * inter, hidden);
    const HostLinearWeight dn = random_stack(rng, f, experts, hidden, inter);
    DevStack d_gu = to_device(gu, f, s), d_dn = to_device(dn, f, s);
    MoeExpertWeights cw;
    cw.gate_up.weight = cpu_weight(cpu, gu);
    cw.gate_up.stack = experts;
    cw.down.weight = cpu_weight(cpu, dn);
    cw.down.stack = experts;
    for (int64_t tokens : {1, 12, 20, 40}) {
      const int64_t n = tokens * k;
      const auto x = random_bf16(rng, tokens * hidden, 1.0f);
      std::vector<int32_t> ids(static_cast<size_t>(n));
      std::vector<float> wts(static_cast<size_t>(n));
      std::uniform_real_distribution<float> wd(0.1f, 1.0f);
      for (int64_t t = 0; t < tokens; ++t) {
        std::vector<int32_t> all(static_cast<size_t>(experts));
        for (int e = 0; e < experts; ++e) all[size_t(e)] = e;
        std::shuffle(all.begin(), all.end(), rng);
        if (tokens == 40)
          std::swap(all[0], all[size_t(std::find(all.begin(), all.end(), 5) - all.begin())]);
        for (int j = 0; j < k; ++j) {
          ids[size_t(t * k + j)] = all[size_t(j)];
          wts[size_t(t * k + j)] = wd(rng);
        }
      }
      HostTensor hx(DType::kF32, {tokens, hidden}), hids(DType::kI32, {tokens, k}),
          hw(DType::kF32, {tokens, k}), ho(DType::kF32, {tokens, hidden});
      std::memcpy(hx.f32(), x.data(), x.size() * 4);
      std::memcpy(hids.view.ptr<int32_t>(), ids.data(), ids.size() * 4);
      std::memcpy(hw.f32(), wts.data(), wts.size() * 4);
      cpu.moe_experts(hx.view, cw, hids.view, hw.view, ho.view);
      const std::vector<double> want(ho.f32(), ho.f32() + tokens * hidden);
      auto dx = upload(to_bits(x), s), d_ids = upload(ids, s), d_w = upload(wts, s);
      Dev act(size_t(n * inter) * 2), y(size_t(n * hidden) * 2),
          out(size_t(tokens * hidden + kGuard) * 2);
      for (const GemvShapeCase& sh : kGemvShapes) {
        cuda::MoeGroupedParams g{};
        g.topk_ids = d_ids->as<int32_t>();
        g.assignments = n;
        g.num_experts = experts;
        g.max_active = int(std::min<int64_t>(experts, n));
        g.gemv_tokens = cuda::moe_gemv_tokens(tokens, k, experts);
        cuda::MoeGroupedParams g_up = g, g_dn = g;
        g_up.x = dx->as<bf16_bits>();
        g_up.rows = tokens;
        g_up.x_div = k;
        g_up.out = act.as<bf16_bits>();
        g_up.w = d_gu.view;
        g_up.glu_inter = inter;
        g_dn.x = act.as<bf16_bits>();
        g_dn.rows = n;
        g_dn.x_div = 1;
        g_dn.out = y.as<bf16_bits>();
        g_dn.w = d_dn.view;
        g_dn.early_plan = 1;  // gate_up triggers after its wait
        const bool up_forced = force_shape(g_up, sh), dn_forced = force_shape(g_dn, sh);
        if (sh.ksplit != 0 && !up_forced && !dn_forced) continue;
        std::vector<uint16_t> first;
        for (int rep = 0; rep < 2; ++rep) {
          CUDA_CHECK(cudaMemsetAsync(act.as<void>(), 0xff, act.bytes(), s.get()));
          CUDA_CHECK(cudaMemsetAsync(y.as<void>(), 0xff, y.bytes(), s.get()));
          CUDA_CHECK(cudaMemsetAsync(out.as<void>(), 0xff, out.bytes(), s.get()));
          cuda::launch_moe_gemv(g_up, s.get());
          cuda::launch_moe_gemv(g_dn, s.get());
          cuda::MoeCombineParams cb{};
          cb.y = y.as<bf16_bits>();
          cb.topk_ids = d_ids->as<int32_t>();
          cb.topk_weights = d_w->as<float>();
          cb.out = out.as<bf16_bits>();
          cb.tokens = tokens;
          cb.hidden = hidden;
          cb.top_k = k;
          cb.num_experts = experts;
          cuda::launch_moe_combine(cb, s.get());
          const auto all = download<uint16_t>(out.as<void>(), size_t(tokens * hidden + kGuard), s);
          bool guard = true;
          for (int64_t i = tokens * hidden; i < tokens * hidden + kGuard; ++i)
            guard &= all[size_t(i)] == 0xffff;
          std::vector<float> got(size_t(tokens * hidden));
          for (size_t i = 0; i < got.size(); ++i) got[i] = bf16_to_f32(all[i]);
          const double e = nmse(got, want);
          const std::string what =
              std::string(fmt_name(f)) + " T " + std::to_string(tokens) + " gate_up " +
              std::to_string(g_up.ksplit) + "/" + std::to_string(g_up.cluster) + "/" +
              std::to_string(g_up.tiles_per_warp) + " down " + std::to_string(g_dn.ksplit) + "/" +
              std::to_string(g_dn.cluster) + "/" + std::to_string(g_dn.tiles_per_warp);
          EXPECT_LT(e, 4e-5) << what;
          EXPECT_TRUE(guard) << "wrote past the output: " << what;
          if (rep == 0) {
            first.assign(all.begin(), all.begin() + tokens * hidden);
            std::printf("gemv    %-9s T %2lld shape gate_up %d/%d/%d down %d/%d/%d: NMSE %.2e\n",
                        fmt_name(f), static_cast<long long>(tokens), g_up.ksplit, g_up.cluster,
                        g_up.tiles_per_warp, g_dn.ksplit, g_dn.cluster, g_dn.tiles_per_warp, e);
          } else {
            EXPECT_EQ(0, std::memcmp(first.data(), all.data(), first.size() * 2))
                << "not deterministic: " << what;
          }
        }
      }
    }
    // Dense mode: expert 0 of the stack for every row, against the CPU twin's one expert.
    MoeExpertWeights cw1;
    HostLinearWeight gu1 = gu, dn1 = dn;
    for (HostLinearWeight* w : {&gu1, &dn1}) {  // the first expert's bytes
      w->values.resize(w->values.size() / size_t(experts));
      w->scales.resize(w->scales.size() / size_t(experts));
      w->stack = 1;
      w->check_sizes();
    }
    cw1.gate_up.weight = cpu_weight(cpu, gu1);
    cw1.down.weight = cpu_weight(cpu, dn1);
    for (int64_t tokens : {1, 9, 40}) {
      const auto x = random_bf16(rng, tokens * hidden, 1.0f);
      HostTensor hx(DType::kF32, {tokens, hidden}), hids(DType::kI32, {tokens, 1}),
          hw(DType::kF32, {tokens, 1}), ho(DType::kF32, {tokens, hidden});
      std::memcpy(hx.f32(), x.data(), x.size() * 4);
      for (int64_t t = 0; t < tokens; ++t) {
        hids.view.ptr<int32_t>()[t] = 0;
        hw.f32()[t] = 1.0f;
      }
      cpu.moe_experts(hx.view, cw1, hids.view, hw.view, ho.view);
      const std::vector<double> want(ho.f32(), ho.f32() + tokens * hidden);
      auto dx = upload(to_bits(x), s);
      Dev act(size_t(tokens * inter) * 2), out(size_t(tokens * hidden + kGuard) * 2);
      for (const GemvShapeCase& sh : kGemvShapes) {
        cuda::MoeGroupedParams g{};
        g.gemv_tokens = int(std::min<int64_t>(tokens, 32));
        g.rows = tokens;
        cuda::MoeGroupedParams g_up = g, g_dn = g;
        g_up.x = dx->as<bf16_bits>();
        g_up.out = act.as<bf16_bits>();
        g_up.w = d_gu.view;
        g_up.glu_inter = inter;
        g_dn.x = act.as<bf16_bits>();
        g_dn.out = out.as<bf16_bits>();
        g_dn.w = d_dn.view;
        const bool up_forced = force_shape(g_up, sh), dn_forced = force_shape(g_dn, sh);
        if (sh.ksplit != 0 && !up_forced && !dn_forced) continue;
        CUDA_CHECK(cudaMemsetAsync(act.as<void>(), 0xff, act.bytes(), s.get()));
        CUDA_CHECK(cudaMemsetAsync(out.as<void>(), 0xff, out.bytes(), s.get()));
        cuda::launch_moe_gemv(g_up, s.get());
        cuda::launch_moe_gemv(g_dn, s.get());
        const auto all = download<uint16_t>(out.as<void>(), size_t(tokens * hidden + kGuard), s);
        bool guard = true;
        for (int64_t i = tokens * hidden; i < tokens * hidden + kGuard; ++i)
          guard &= all[size_t(i)] == 0xffff;
        std::vector<float> got(size_t(tokens * hidden));
        for (size_t i = 0; i < got.size(); ++i) got[i] = bf16_to_f32(all[i]);
        const double e = nmse(got, want);
        EXPECT_LT(e, 4e-5) << "dense " << fmt_name(f) << " T " << tokens << " shape " << g_up.ksplit
                           << "/" << g_up.cluster << "/" << g_up.tiles_per_warp;
        EXPECT_TRUE(guard) << "dense wrote past the output: " << fmt_name(f);
        std::printf("dense   %-9s T %2lld shape gate_up %d/%d/%d down %d/%d/%d: NMSE %.2e\n",
                    fmt_name(f), static_cast<long long>(tokens), g_up.ksplit, g_up.cluster,
                    g_up.tiles_per_warp, g_dn.ksplit, g_dn.cluster, g_dn.tiles_per_warp, e);
      }
    }
  }
}

// ---- prefill GEMM, short k (the x-resident down projection) ----
// The prefill pieces (plan, gate_up GEMM, down GEMM with gemm_blocks forced, combine) against
// the CPU twin: gemm_blocks -1 (the one-block pipeline), 1, 3 (blocks that do not divide n's),
// 8 and 16; plan tiles of 64 rows and of 128 (two sub-tiles each); hidden 1056 (a last block of
// two row tiles); inter 192 (three k steps: an odd element count).
struct ShortKCase {
  Fmt fmt;
  int64_t hidden, inter;
  int experts, top_k;
  int64_t tokens;
};
const ShortKCase kShortKCases[] = {
    {Fmt::kFp8, 2048, 256, 16, 4, 300},      {Fmt::kInt4g32, 2048, 256, 16, 4, 300},
    {Fmt::kInt4g128, 2048, 256, 16, 4, 300}, {Fmt::kFp8, 1056, 256, 8, 2, 1000},
    {Fmt::kInt4g32, 1056, 256, 8, 2, 1000},  {Fmt::kInt4g32, 1056, 192, 8, 2, 300},
};

TEST(MoeParity, GemmShortKMatchCpu) {
  Stream s;
  std::mt19937 rng(23);
  cpu::CpuBackend cpu;
  for (const ShortKCase& c : kShortKCases) {
    const int64_t hidden = c.hidden, inter = c.inter, tokens = c.tokens;
    const int experts = c.experts, k = c.top_k;
    const int64_t n = tokens * k;
    const HostLinearWeight gu = random_stack(rng, c.fmt, experts, 2 * inter, hidden);
    const HostLinearWeight dn = random_stack(rng, c.fmt, experts, hidden, inter);
    DevStack d_gu = to_device(gu, c.fmt, s), d_dn = to_device(dn, c.fmt, s);
    MoeExpertWeights cw;
    cw.gate_up.weight = cpu_weight(cpu, gu);
    cw.gate_up.stack = experts;
    cw.down.weight = cpu_weight(cpu, dn);
    cw.down.stack = experts;
    const auto x = random_bf16(rng, tokens * hidden, 1.0f);
    std::vector<int32_t> ids(static_cast<size_t>(n));
    std::vector<float> wts(static_cast<size_t>(n));
    std::uniform_real_distribution<float> wd(0.1f, 1.0f);
    for (int64_t t = 0; t < tokens; ++t) {
      std::vector<int32_t> all(static_cast<size_t>(experts));
      for (int e = 0; e < experts; ++e) all[size_t(e)] = e;
      std::shuffle(all.begin(), all.end(), rng);
      for (int j = 0; j < k; ++j) {
        ids[size_t(t * k + j)] = all[size_t(j)];
        wts[size_t(t * k + j)] = wd(rng);
      }
    }
    HostTensor hx(DType::kF32, {tokens, hidden}), hids(DType::kI32, {tokens, k}),
        hw(DType::kF32, {tokens, k}), ho(DType::kF32, {tokens, hidden});
    std::memcpy(hx.f32(), x.data(), x.size() * 4);
    std::memcpy(hids.view.ptr<int32_t>(), ids.data(), ids.size() * 4);
    std::memcpy(hw.f32(), wts.data(), wts.size() * 4);
    cpu.moe_experts(hx.view, cw, hids.view, hw.view, ho.view);
    const std::vector<double> want(ho.f32(), ho.f32() + tokens * hidden);

    auto dx = upload(to_bits(x), s), d_ids = upload(ids, s), d_w = upload(wts, s);
    const int tile_rows = cuda::moe_gemm_tile_rows(tokens, k, experts);
    const int64_t max_tiles = cuda::moe_max_tiles(n, experts, tile_rows);
    Dev offsets(size_t(experts + 1) * 4), pos(size_t(n) * 4), row_token(size_t(n) * 4),
        active(size_t(experts) * 4), counts(8), tiles(size_t(max_tiles) * 8),
        block_counts(size_t(cuda::moe_plan_blocks(n) * experts) * 4);
    cuda::MoePlanParams pp{};
    pp.topk_ids = d_ids->as<int32_t>();
    pp.plan = {offsets.as<int32_t>(),     pos.as<int32_t>(),    row_token.as<int32_t>(),
               active.as<int32_t>(),      counts.as<int32_t>(), tiles.as<int32_t>(),
               block_counts.as<int32_t>()};
    pp.assignments = n;
    pp.top_k = k;
    pp.num_experts = experts;
    pp.tile_rows = tile_rows;
    cuda::launch_moe_plan(pp, s.get());
    Dev act(size_t(n * inter) * 2), y(size_t(n * hidden) * 2),
        out(size_t(tokens * hidden + kGuard) * 2);
    cuda::MoeGroupedParams g{};
    g.offsets = offsets.as<int32_t>();
    g.tiles = tiles.as<int32_t>();
    g.counts = counts.as<int32_t>();
    g.max_tiles = int(max_tiles);
    g.tile_rows = tile_rows;
    cuda::MoeGroupedParams g_up = g, g_dn = g;
    g_up.x = dx->as<bf16_bits>();
    g_up.row_token = row_token.as<int32_t>();
    g_up.rows = tokens;
    g_up.out = act.as<bf16_bits>();
    g_up.w = d_gu.view;
    g_up.glu_inter = inter;
    cuda::launch_moe_gemm(g_up, s.get());
    g_dn.x = act.as<bf16_bits>();
    g_dn.rows = n;
    g_dn.out = y.as<bf16_bits>();
    g_dn.w = d_dn.view;
    for (int blocks : {-1, 1, 3, 8, 16}) {
      g_dn.gemm_blocks = blocks;
      std::vector<uint16_t> first;
      for (int rep = 0; rep < 2; ++rep) {
        CUDA_CHECK(cudaMemsetAsync(y.as<void>(), 0xff, y.bytes(), s.get()));
        CUDA_CHECK(cudaMemsetAsync(out.as<void>(), 0xff, out.bytes(), s.get()));
        cuda::launch_moe_gemm(g_dn, s.get());
        cuda::MoeCombineParams cb{};
        cb.y = y.as<bf16_bits>();
        cb.pos = pos.as<int32_t>();
        cb.topk_ids = d_ids->as<int32_t>();
        cb.topk_weights = d_w->as<float>();
        cb.out = out.as<bf16_bits>();
        cb.tokens = tokens;
        cb.hidden = hidden;
        cb.top_k = k;
        cb.num_experts = experts;
        cuda::launch_moe_combine(cb, s.get());
        const auto all = download<uint16_t>(out.as<void>(), size_t(tokens * hidden + kGuard), s);
        bool guard = true;
        for (int64_t i = tokens * hidden; i < tokens * hidden + kGuard; ++i)
          guard &= all[size_t(i)] == 0xffff;
        std::vector<float> got(size_t(tokens * hidden));
        for (size_t i = 0; i < got.size(); ++i) got[i] = bf16_to_f32(all[i]);
        const double e = nmse(got, want);
        EXPECT_LT(e, 4e-5) << fmt_name(c.fmt) << " H " << hidden << " I " << inter << " T "
                           << tokens << " tile " << tile_rows << " gemm_blocks " << blocks;
        EXPECT_TRUE(guard) << "wrote past the output: " << fmt_name(c.fmt);
        if (rep == 0) {
          first.assign(all.begin(), all.begin() + tokens * hidden);
          std::printf("shortk  %-9s H %4lld I %3lld T %4lld tile %3d gemm_blocks %2d: NMSE %.2e\n",
                      fmt_name(c.fmt), static_cast<long long>(hidden),
                      static_cast<long long>(inter), static_cast<long long>(tokens), tile_rows,
                      blocks, e);
        } else {
          EXPECT_EQ(0, std::memcmp(first.data(), all.data(), first.size() * 2))
              << "not deterministic: " << fmt_name(c.fmt) << " gemm_blocks " << blocks;
        }
      }
    }
  }
}

// Dense mode (a shared expert in the tile layout): gate_up then down with every row, against
// the CPU twin's moe_experts with one expert of weight 1.
TEST(MoeParity, DenseModeMatchesCpu) {
  Stream s;
  std::mt19937 rng(17);
  cpu::CpuBackend cpu;
  for (Fmt f : {Fmt::kBf16, Fmt::kFp8, Fmt::kInt4g32}) {
    const int64_t hidden = 320, inter = f == Fmt::kFp8 ? 256 : 192;
    const HostLinearWeight gu = random_stack(rng, f, 1, 2 * inter, hidden);
    const HostLinearWeight dn = random_stack(rng, f, 1, hidden, inter);
    DevStack d_gu = to_device(gu, f, s), d_dn = to_device(dn, f, s);
    MoeExpertWeights cw;
    cw.gate_up.weight = cpu_weight(cpu, gu);
    cw.down.weight = cpu_weight(cpu, dn);
    for (int64_t tokens : {1, 9, 40, 200}) {
      const auto x = random_bf16(rng, tokens * hidden, 1.0f);
      HostTensor hx(DType::kF32, {tokens, hidden}), hids(DType::kI32, {tokens, 1}),
          hw(DType::kF32, {tokens, 1}), ho(DType::kF32, {tokens, hidden});
      std::memcpy(hx.f32(), x.data(), x.size() * 4);
      for (int64_t t = 0; t < tokens; ++t) {
        hids.view.ptr<int32_t>()[t] = 0;
        hw.f32()[t] = 1.0f;
      }
      cpu.moe_experts(hx.view, cw, hids.view, hw.view, ho.view);
      std::vector<double> want(ho.f32(), ho.f32() + tokens * hidden);
      auto dx = upload(to_bits(x), s);
      for (bool gemm : {false, true}) {
        Dev act(size_t(tokens * inter) * 2), out(size_t(tokens * hidden + kGuard) * 2);
        CUDA_CHECK(cudaMemsetAsync(act.as<void>(), 0xff, act.bytes(), s.get()));
        CUDA_CHECK(cudaMemsetAsync(out.as<void>(), 0xff, out.bytes(), s.get()));
        cuda::MoeGroupedParams g{};
        g.tile_rows = tokens > 100 ? 128 : 64;
        g.gemv_tokens = int(std::min<int64_t>(tokens, 32));
        g.x = dx->as<bf16_bits>();
        g.rows = tokens;
        g.out = act.as<bf16_bits>();
        g.w = d_gu.view;
        g.glu_inter = inter;
        gemm ? cuda::launch_moe_gemm(g, s.get()) : cuda::launch_moe_gemv(g, s.get());
        g.x = act.as<bf16_bits>();
        g.out = out.as<bf16_bits>();
        g.w = d_dn.view;
        g.glu_inter = 0;
        gemm ? cuda::launch_moe_gemm(g, s.get()) : cuda::launch_moe_gemv(g, s.get());
        const auto all = download<uint16_t>(out.as<void>(), size_t(tokens * hidden + kGuard), s);
        bool guard = true;
        for (int64_t i = tokens * hidden; i < tokens * hidden + kGuard; ++i)
          guard &= all[size_t(i)] == 0xffff;
        std::vector<float> got(size_t(tokens * hidden));
        for (size_t i = 0; i < got.size(); ++i) got[i] = bf16_to_f32(all[i]);
        // Three bf16 roundings (gate/up, act, out): bound as the layer's.
        const double e = nmse(got, want);
        EXPECT_LT(e, 4e-5) << "dense " << fmt_name(f) << (gemm ? " gemm" : " gemv") << " T "
                           << tokens;
        EXPECT_TRUE(guard) << "dense " << fmt_name(f) << " wrote past the output";
        std::printf("dense   %-9s %s T %3lld: NMSE %.2e\n", fmt_name(f), gemm ? "gemm" : "gemv",
                    static_cast<long long>(tokens), e);
      }
    }
  }
}

}  // namespace
}  // namespace strata
