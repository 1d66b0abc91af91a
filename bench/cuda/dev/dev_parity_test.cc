// The development kernels (dev_kernels.h) against the CPU reference, through the CUDA backend
// (CudaBackend::set_dev_kernels), with tests/parity's fixtures and bounds: they moved out of
// tests/parity (CudaParity.LinearMma, CudaFusedParity.LinearSiluMulMma and the variant loops of
// CudaParity.PrefillAttention / PrefillAttentionTiles) with their kernels. Binary:
// strata_dev_parity_test (GPU machine).
#include <gtest/gtest.h>

#include <cstdio>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "dev_kernels.h"
#include "parity/fused_fixture.h"
#include "parity/kv_fp8_attention.h"
#include "parity/op_pair.h"

namespace strata {
namespace {

using parity::AttnCase;
using parity::LinearCase;
using parity::Pair;

// The tensor-core GEMV for every row count it serves (1..64: 1 to 8 n-tiles of 8 tokens, partial
// ones included), k = 8 (one partial 32-element chunk), odd multiples of 8 (a tail after the
// 128-element blocks) and 4,096; odd n (a partial 16-row tile); with and without bias; each with
// 1, 2, 4 and 8 warps per tile (the k-split target picks: n = 2,113 is 133 tiles, n = 1,001 63,
// on the H200's 132 SMs).
TEST(DevParity, LinearMma) {
  Pair p;
  for (int per_sm : {1, 2, 4, 24}) {
    p.cuda().set_dev_kernels(cuda::dev::gemv_mma_kernels(1, cuda::dev::kGemvMmaMaxRows, per_sm));
    for (int m : {1, 2, 3, 5, 8, 9, 16, 17, 31, 32, 33, 64}) {
      for (LinearCase c : {LinearCase{m, 264, 2113, true}, LinearCase{m, 1000, 1001, false},
                           LinearCase{m, 8, 17, m % 2 == 1}, LinearCase{m, 4104, 77, m % 2 == 0}}) {
        const double e = parity::linear_nmse(p, c);
        EXPECT_LT(e, 1e-5) << "warps/SM " << per_sm << " m " << c.m << " k " << c.k << " n " << c.n
                           << " bias " << c.bias;
        if (per_sm == 24 || e >= 1e-5)
          std::printf("linear mma warps/SM %d m=%d k=%d n=%d bias=%d nmse %.3g\n", per_sm, c.m, c.k,
                      c.n, c.bias, e);
      }
    }
  }
  // The 8B decode shapes at the default split.
  p.cuda().set_dev_kernels(cuda::dev::gemv_mma_kernels(1, cuda::dev::kGemvMmaMaxRows));
  for (int m : {8, 32}) {
    for (LinearCase c : {LinearCase{m, 4096, 6144, false}, LinearCase{m, 14336, 4096, false}}) {
      const double e = parity::linear_nmse(p, c);
      EXPECT_LT(e, 1e-5) << "m " << c.m << " k " << c.k << " n " << c.n;
      std::printf("linear mma m=%d k=%d n=%d nmse %.3g\n", c.m, c.k, c.n, e);
    }
  }
}

// linear_silu_mul on the tensor-core GEMV (gate rows as tile rows 0-7, up rows as 8-15): NMSE
// against the CPU < 2e-5 and bit for bit the unfused path (the same kernel's plain launch, then
// silu_mul) for every row count it serves, odd k (multiples of 8) and odd inter, with and
// without bias, early PDL trigger on and off, 1 to 8 warps per tile.
TEST(DevParity, LinearSiluMulMma) {
  parity::Fixture f;
  struct Case {
    int k, inter;
    bool bias;
  };
  for (int m : {1, 2, 3, 5, 8, 9, 16, 17, 31, 32, 33, 64}) {
    for (Case c : {Case{264, 1057, true}, Case{1000, 129, false}, Case{8, 7, true},
                   Case{4104, 501, false}}) {
      const parity::Fixture::GluCase g = f.glu_case(m, c.k, c.inter, c.bias);
      const std::vector<float>& want = g.want;
      for (int per_sm : {1, 4, 24}) {
        f.cg.set_dev_kernels(cuda::dev::gemv_mma_kernels(1, cuda::dev::kGemvMmaMaxRows, per_sm));
        f.cg.tune([](cuda::CudaTunables& t) { t.fusion = false; });
        const auto unfused = f.gpu_glu(g);
        for (bool early : {false, true}) {
          f.cg.tune([&](cuda::CudaTunables& t) {
            t.fusion = true;
            t.pdl_early = early;
          });
          const auto got = f.gpu_glu(g);
          const double e = parity::nmse(got, want);
          const bool same = parity::same_bits(got, unfused);
          // A handful of outputs (k 8, inter 7 at m 1: 7 values) gives no average: each carries up
          // to three bf16 roundings (g, u, the product; ~6e-3 relative), NMSE 2.5e-5 measured.
          const double bound = int64_t(m) * c.inter < 64 ? 4e-5 : 2e-5;
          EXPECT_LT(e, bound) << "m " << m << " k " << c.k << " inter " << c.inter;
          EXPECT_TRUE(same) << "fused != unfused: m " << m << " k " << c.k << " inter " << c.inter
                            << " warps/SM " << per_sm << " early " << early;
          if ((per_sm == 24 && !early) || !same || e >= bound)
            std::printf(
                "linear_silu_mul mma m=%d k=%d inter=%d bias=%d warps/SM %d early %d: "
                "nmse %.3g, bits %s the unfused path\n",
                m, c.k, c.inter, c.bias, per_sm, int(early), e, same ? "equal" : "DIFFER from");
        }
      }
    }
  }
}

// Every prefill variant on CudaParity.PrefillAttention's and PrefillAttentionTiles' cases with
// bf16 KV and on KvFp8.PrefillAttention's with fp8 KV (split-KV prefill off: the regular
// kernels), bound NMSE < 1e-4 as there.
TEST(DevParity, PrefillAttentionVariants) {
  std::vector<AttnCase> cases = {{32, 8, 128, 16, {{0, 77}, {50, 13}, {0, 1}, {200, 130}}},
                                 {5, 1, 64, 3, {{0, 200}, {31, 5}}}};
  for (const AttnCase& c : parity::prefill_tile_cases()) cases.push_back(c);
  for (auto v : cuda::dev::kPrefillVariants) {
    std::printf("prefill kernel %s\n", cuda::dev::prefill_variant_name(v));
    for (const AttnCase& c : cases) {
      parity::run_attention(c, [v](cuda::CudaBackend& be) {
        be.tune([](cuda::CudaTunables& t) { t.prefill_split_mode = 0; });
        be.set_dev_kernels(cuda::dev::prefill_variant_kernels(v));
      });
    }
    for (DType dt : {DType::kFP8E4M3, DType::kFP8E5M2}) {
      for (const parity::Fp8AttnCase& c : parity::fp8_prefill_cases()) {
        parity::run_fp8_attention(
            dt, c.heads, c.kv_heads, c.hd, c.page, c.seqs, c.ks, c.vs, [v](cuda::CudaBackend& be) {
              be.tune([](cuda::CudaTunables& t) { t.prefill_split_mode = 0; });
              be.set_dev_kernels(cuda::dev::prefill_variant_kernels(v));
            });
      }
    }
  }
}

}  // namespace
}  // namespace strata
