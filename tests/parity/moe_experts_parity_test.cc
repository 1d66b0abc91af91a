// Mixture-of-experts expert layers on the GPU (backend/cuda/moe_experts.h) against the CPU twin
// (cpu::CpuBackend::moe_experts, backend/cpu/moe.cc), on raw device buffers, odd sizes: the
// weight repack, the routed layer in every format and regime, and dense mode (a shared expert).
// The work decompositions of the same kernels: moe_gemm_shapes_parity_test.cc.
//
// References and bounds:
// - repack (bf16, fp8 tile layouts): rebuilt here from moe_experts.cuh's documentation, byte
//   for byte.
// - experts (every format, both regimes): the CPU twin with the same weights (dequantized on the
//   host by core/weight_format's reference, the values the kernels compute with, bit for bit),
//   x the same bf16 values. The GPU rounds gate and up to bf16 before silu, then act, each
//   expert's output y and the final sum: four bf16 roundings (2⁻⁹ relative at worst, ~1.1e-3
//   RMS each), which propagate to an NMSE of ~6e-6; bound 4e-5. A wrong row, expert, tile or
//   scale gives 1e-2 to 2; an output never written keeps its NaN poison (infinite NMSE), and a
//   poisoned guard after the output must survive. The same layer twice gives the same bits
//   (rows inside an expert's segment are placed by atomics; values must not depend on it).
//   FP8 decode also runs against x staged in f16 (fp8_f16): its weights are not rounded to bf16
//   (w · s stays exact in the float32 sums), one rounding fewer than the twin's bf16(w · s), so
//   the same bound holds; moe_fp8_f16_parity_test.cc checks the staging itself.
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
    {Fmt::kFp8, 336, 128, 8, 2},  // hidden % 32 != 0: gate_up keeps bf16 x under fp8_f16
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
      std::vector<double> want = cpu_moe_experts(cpu, cw, x, ids, wts, k);
      for (size_t i = 0; i < want.size(); ++i)  // the add in float32, as before
        want[i] = float(want[i]) + (with_add ? add[i] : 0.0f);

      auto dx = upload(to_bits(x), s), d_ids = upload(ids, s), d_w = upload(wts, s),
           d_add = upload(to_bits(add), s);
      // Decode, decode with x staged in f16 (fp8 only: by a launch, moe_stage_f16.cu, or by the
      // GEMV's CTAs in shared memory where it fits), prefill.
      for (int mode : {0, 1, 3, 2}) {
        if ((mode == 1 || mode == 3) && c.fmt != Fmt::kFp8) continue;
        const int regime = mode == 2 ? cuda::kMoePrefill : cuda::kMoeDecode;
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
          p.fp8_f16 = mode == 1 || mode == 3;
          p.fp8_f16_smem_max_tokens = mode == 3 ? 1 << 30 : 0;
          cuda::launch_moe_experts(p, s.get());
          bool guard = false;
          const auto all = read_output(out, tokens * hidden, s, &guard);
          const std::vector<float> got = from_bits(all);
          const double e = nmse(got, want);
          const char* rname = mode == 0   ? "decode"
                              : mode == 1 ? "dec-f16"
                              : mode == 3 ? "dec-f16s"
                                          : "prefill";
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
      std::vector<double> want =
          cpu_moe_experts(cpu, cw, x, std::vector<int32_t>(size_t(tokens), 0),
                          std::vector<float>(size_t(tokens), 1.0f), 1);
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
        bool guard = false;
        const auto all = read_output(out, tokens * hidden, s, &guard);
        const std::vector<float> got = from_bits(all);
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
}  // namespace strata::parity
