// The work decompositions of the GPU's MoE expert kernels (backend/cuda/moe_experts.h) against
// the CPU twin (cpu::CpuBackend::moe_experts): every forced decode-GEMV shape and the prefill
// GEMM's short-k block splits give the layer's result.
//
// References and bounds:
// - experts: the CPU twin with the same weights (dequantized on the host by core/weight_format's
//   reference), x the same bf16 values; four bf16 roundings on the GPU side: NMSE bound 4e-5
//   (moe_experts_parity_test.cc says why). An output never written keeps its NaN poison.
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
#include "backend/cuda/moe_experts.h"
#include "backend/cuda/moe_route.h"
#include "parity/moe_device.h"

namespace strata::parity {
namespace {

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

// The decode step's last piece: the combine of y (rows in assignment order, or permuted with pos,
// MoePlan::pos) into out.
void launch_combine(const bf16_bits* y, const int32_t* pos, const int32_t* ids, const float* w,
                    bf16_bits* out, int64_t tokens, int64_t hidden, int k, int experts,
                    cudaStream_t s) {
  cuda::MoeCombineParams cb{};
  cb.y = y;
  cb.pos = pos;
  cb.topk_ids = ids;
  cb.topk_weights = w;
  cb.out = out;
  cb.tokens = tokens;
  cb.hidden = hidden;
  cb.top_k = k;
  cb.num_experts = experts;
  cuda::launch_moe_combine(cb, s);
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
      const std::vector<double> want = cpu_moe_experts(cpu, cw, x, ids, wts, k);
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
          launch_combine(y.as<bf16_bits>(), nullptr, d_ids->as<int32_t>(), d_w->as<float>(),
                         out.as<bf16_bits>(), tokens, hidden, k, experts, s.get());
          bool guard = false;
          const auto all = read_output(out, tokens * hidden, s, &guard);
          const std::vector<float> got = from_bits(all);
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
      const std::vector<double> want =
          cpu_moe_experts(cpu, cw1, x, std::vector<int32_t>(size_t(tokens), 0),
                          std::vector<float>(size_t(tokens), 1.0f), 1);
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
        bool guard = false;
        const auto all = read_output(out, tokens * hidden, s, &guard);
        const std::vector<float> got = from_bits(all);
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
// two row tiles); inter 192 (three k steps: an odd element count); plan tiles forced to the
// instance the rule does not take: 64 rows for experts of ~250 (four tiles, the last partial),
// 128 for experts of ~62 (one tile, half of its x rows past the expert's end, zero-filled);
// gate_up and the one-block down. Then, where it
// applies (k 128 or 256), the weight-stationary kernel (moe_experts_gemm_ws.cu; "gemm_blocks ws",
// and "ws narrow": an expert's last x tile of <= 32 rows at wgmma n = 32, fp8 and int4 at k = 256):
// experts of up to ~250 rows (four x tiles), 64 experts for 40 rows (most of them empty), k = 128;
// and where it applies (plan tiles of 128 rows) the producer-warp kernel (moe_experts_gemm_pipe.cu;
// "gemm_blocks pipe"), whose gate_up must give the two-CTA kernel's act bit for bit.
struct ShortKCase {
  Fmt fmt;
  int64_t hidden, inter;
  int experts, top_k;
  int64_t tokens;
  int tile_rows = 0;  // the plan's tiles forced (0: moe_gemm_tile_rows)
};
const ShortKCase kShortKCases[] = {
    {Fmt::kFp8, 2048, 256, 16, 4, 250},
    {Fmt::kInt4g32, 2048, 256, 16, 4, 250},
    {Fmt::kInt4g128, 2048, 256, 16, 4, 250},
    {Fmt::kFp8, 1056, 256, 8, 2, 1000},
    {Fmt::kInt4g32, 1056, 256, 8, 2, 1000},
    {Fmt::kInt4g32, 1056, 192, 8, 2, 300},
    {Fmt::kFp8, 1056, 128, 8, 2, 300},
    {Fmt::kInt4g32, 1056, 256, 64, 2, 20},
    {Fmt::kFp8, 1056, 256, 64, 2, 20},  // (fp8's narrow tail)
    {Fmt::kBf16, 1056, 256, 8, 2, 300},
    {Fmt::kFp8, 1056, 256, 8, 2, 1000, 64},
    {Fmt::kInt4g32, 1056, 256, 8, 2, 1000, 64},
    {Fmt::kBf16, 1056, 256, 8, 2, 1000, 64},
    {Fmt::kInt4g128, 2048, 256, 16, 4, 250, 128},
    {Fmt::kFp8, 2048, 256, 16, 4, 600},      // hidden % 64 == 0 and 128-row tiles: the
    {Fmt::kInt4g32, 2048, 256, 16, 4, 600},  // producer-warp gate_up too
    {Fmt::kBf16, 2048, 256, 8, 2, 300, 128},
    {Fmt::kFp8, 1024, 1024, 16, 4, 600},      // the producer-warp GEMM at inter 1,024: 8
    {Fmt::kInt4g32, 1024, 1024, 16, 4, 600},  // gate_up and 4 down weight units a tile,
    {Fmt::kBf16, 1024, 1024, 16, 4, 600},     // more CTAs than SMs
    {Fmt::kFp8, 1024, 1024, 8, 2, 1000},      // ~250 rows an expert: a full plan tile and a
    {Fmt::kInt4g32, 1024, 1024, 8, 2, 1000},  // partial one above 64 rows (wgmma n = 128)
};
constexpr int kWeightStationary = 1000;  // not a block count: the weight-stationary kernel
constexpr int kPipe = 1001;              // nor this: the producer-warp kernel
constexpr int kWsNarrow = 1002;          // the weight-stationary kernel with narrow tails

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
    const std::vector<double> want = cpu_moe_experts(cpu, cw, x, ids, wts, k);

    auto dx = upload(to_bits(x), s), d_ids = upload(ids, s), d_w = upload(wts, s);
    const int tile_rows = c.tile_rows ? c.tile_rows : cuda::moe_gemm_tile_rows(tokens, k, experts);
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
    // The producer-warp GEMM (plan tiles of 128 rows, k % 64 == 0): gate_up's act bit for bit.
    if (cuda::MoeGroupedParams g_up_pipe = g_up;
        g_up_pipe.pipe = 1, cuda::moe_gemm_pipe_supported(g_up_pipe)) {
      Dev act2(size_t(n * inter) * 2);
      CUDA_CHECK(cudaMemsetAsync(act2.as<void>(), 0xff, act2.bytes(), s.get()));
      g_up_pipe.out = act2.as<bf16_bits>();
      cuda::launch_moe_gemm(g_up_pipe, s.get());
      std::vector<uint16_t> h1(size_t(n * inter)), h2(size_t(n * inter));
      CUDA_CHECK(cudaMemcpyAsync(h1.data(), act.as<void>(), h1.size() * 2, cudaMemcpyDeviceToHost,
                                 s.get()));
      CUDA_CHECK(cudaMemcpyAsync(h2.data(), act2.as<void>(), h2.size() * 2, cudaMemcpyDeviceToHost,
                                 s.get()));
      CUDA_CHECK(cudaStreamSynchronize(s.get()));
      // Same fragments, same k order: the same bits expected (tail tiles of <= 64 rows run wgmma
      // n = 64 there, n = 128 here: a difference would be one of rounding, printed; an index
      // error is far above the bound).
      int64_t differ = 0;
      for (size_t i = 0; i < h1.size(); ++i) differ += h1[i] != h2[i];
      const std::vector<float> f1 = from_bits(h1);
      const double e = nmse(from_bits(h2), std::vector<double>(f1.begin(), f1.end()));
      EXPECT_LT(e, 1e-7) << "producer-warp gate_up: " << fmt_name(c.fmt) << " H " << hidden << " I "
                         << inter << " T " << tokens << " tile " << tile_rows;
      std::printf(
          "shortk  %-9s H %4lld I %3lld T %4lld tile %3d gate_up producer warp: %lld of "
          "%zu act values differ, NMSE %.2e\n",
          fmt_name(c.fmt), static_cast<long long>(hidden), static_cast<long long>(inter),
          static_cast<long long>(tokens), tile_rows, static_cast<long long>(differ), h1.size(), e);
    }
    g_dn.x = act.as<bf16_bits>();
    g_dn.rows = n;
    g_dn.out = y.as<bf16_bits>();
    g_dn.w = d_dn.view;
    g_dn.num_experts = experts;
    for (int blocks : {-1, 1, 3, 8, 16, kWeightStationary, kWsNarrow, kPipe}) {
      const bool narrow = blocks == kWsNarrow;
      const bool ws = blocks == kWeightStationary || narrow, pipe = blocks == kPipe;
      g_dn.gemm_blocks = ws || pipe ? 0 : blocks;
      g_dn.weight_stationary = ws ? 1 : 0;
      g_dn.pipe = pipe ? 1 : 0;
      g_dn.narrow_tails = narrow ? 1 : 0;
      if (ws && !cuda::moe_gemm_ws_supported(g_dn)) continue;
      if (pipe && !cuda::moe_gemm_pipe_supported(g_dn)) continue;
      std::vector<uint16_t> first;
      for (int rep = 0; rep < 2; ++rep) {
        CUDA_CHECK(cudaMemsetAsync(y.as<void>(), 0xff, y.bytes(), s.get()));
        CUDA_CHECK(cudaMemsetAsync(out.as<void>(), 0xff, out.bytes(), s.get()));
        cuda::launch_moe_gemm(g_dn, s.get());
        launch_combine(y.as<bf16_bits>(), pos.as<int32_t>(), d_ids->as<int32_t>(), d_w->as<float>(),
                       out.as<bf16_bits>(), tokens, hidden, k, experts, s.get());
        bool guard = false;
        const auto all = read_output(out, tokens * hidden, s, &guard);
        const std::vector<float> got = from_bits(all);
        const double e = nmse(got, want);
        EXPECT_LT(e, 4e-5) << fmt_name(c.fmt) << " H " << hidden << " I " << inter << " T "
                           << tokens << " tile " << tile_rows << " gemm_blocks " << blocks;
        EXPECT_TRUE(guard) << "wrote past the output: " << fmt_name(c.fmt);
        if (rep == 0) {
          first.assign(all.begin(), all.begin() + tokens * hidden);
          std::printf("shortk  %-9s H %4lld I %3lld T %4lld tile %3d gemm_blocks %s: NMSE %.2e\n",
                      fmt_name(c.fmt), static_cast<long long>(hidden),
                      static_cast<long long>(inter), static_cast<long long>(tokens), tile_rows,
                      narrow ? "ws narrow"
                      : ws   ? "ws"
                      : pipe ? "pipe"
                             : std::to_string(blocks).c_str(),
                      e);
        } else {
          EXPECT_EQ(0, std::memcmp(first.data(), all.data(), first.size() * 2))
              << "not deterministic: " << fmt_name(c.fmt) << " gemm_blocks " << blocks;
        }
      }
    }
  }
}

}  // namespace
}  // namespace strata::parity
