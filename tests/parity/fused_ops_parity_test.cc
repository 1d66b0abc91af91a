// The CUDA backend's fused decode ops against the CPU reference and against the CUDA backend's
// own unfused path (the same kernels' roundings, so the fused launch must give the same bits):
//  - linear_silu_mul (the GEMV with SwiGLU as its epilogue): NMSE against the CPU < 2e-5 (two
//    bf16 roundings, the projection's output and the product, where the CPU rounds none), bit
//    for bit the unfused linear + silu_mul on the GPU, for every GEMV launch variant (4- and
//    8-warp blocks, L2 prefetch, the first weights in registers before the wait, early PDL
//    trigger); row counts past the GEMV (cuBLAS path) and k % 8 != 0 take the default and are
//    checked the same way;
//  - qkv_rope_kv_write (split + rope + KV write in one launch): q and the written K/V cache rows
//    bit for bit the unfused slice/rope/kv_write on the GPU, for bf16, fp8 e4m3 and e5m2 caches
//    (non-unit scales), neox and interleaved rope, partial rotary dims, attention factors,
//    positions up to 120,000; against the CPU: q NMSE < 1e-5 (rope's bf16 rounding), bf16 cache
//    rows < 1e-5, fp8 rows < 1e-3 (the GPU rounds rope's output to bf16 before quantizing, as
//    its unfused path does, the CPU quantizes float32: a value near an fp8 rounding boundary can
//    land one fp8 step apart, a step being 2^-3 / 2^-2 of the value).
// Every GPU output is poisoned with NaN first, so an element the kernel fails to write fails.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "parity/fused_fixture.h"

namespace strata {
namespace {

using parity::Fixture;
using parity::nmse;
using parity::same_bits;

TEST(CudaFusedParity, LinearSiluMul) {
  Fixture f;
  // every m <= 8 on the GEMV (default: m <= 2)
  f.cg.tune([](cuda::CudaTunables& t) { t.gemv_max_rows = cuda::kGemvMaxRows; });
  struct Case {
    int m, k, inter;
    bool bias;
  };
  struct Variant {
    int warps;
    int64_t prefetch;
    bool early;
  };
  const Variant variants[] = {{8, 4096, true},    {8, 0, false}, {4, 4096, true},
                              {4, 100000, false}, {8, -1, true}, {4, -1, false}};
  for (Case c : {Case{1, 320, 129, false}, Case{3, 896, 517, true}, Case{8, 64, 33, false},
                 Case{1, 4096, 1001, true}, Case{2, 4104, 7, false}, Case{9, 320, 96, true},
                 Case{5, 100, 40, false}, Case{40, 264, 300, true}}) {
    const Fixture::GluCase g = f.glu_case(c.m, c.k, c.inter, c.bias);
    const std::vector<float>& want = g.want;
    // The GPU's unfused path: linear, then silu_mul.
    f.cg.tune([](cuda::CudaTunables& t) { t.fusion = false; });
    const auto unfused = f.gpu_glu(g);
    for (const Variant& v : variants) {
      f.cg.tune([&](cuda::CudaTunables& t) {
        t.fusion = true;
        t.gemv_block_warps = v.warps;
        t.gemv_prefetch_elems = v.prefetch;
        t.pdl_early = v.early;
      });
      const auto got = f.gpu_glu(g);
      const double e = nmse(got, want);
      EXPECT_LT(e, 2e-5) << "m " << c.m << " k " << c.k << " inter " << c.inter;
      EXPECT_TRUE(same_bits(got, unfused))
          << "fused != unfused: m " << c.m << " k " << c.k << " inter " << c.inter << " warps "
          << v.warps << " prefetch " << v.prefetch << " early " << v.early;
      std::printf(
          "linear_silu_mul m=%d k=%d inter=%d bias=%d warps %d prefetch %lld early %d: "
          "nmse %.3g, bits %s the unfused path\n",
          c.m, c.k, c.inter, c.bias, v.warps, (long long)v.prefetch, int(v.early), e,
          same_bits(got, unfused) ? "equal" : "DIFFER from");
    }
  }
}

struct QkvCase {
  int heads, kv_heads, head_dim, rotary;
  bool interleaved;
  float factor;
  int tokens;
  DType kv_dtype;
  float k_scale, v_scale;
};

// The K (is_k) or V rows of `slots` from a cache, as floats.
std::vector<float> cache_rows(Fixture& f, Backend& b, const Tensor& cache,
                              const std::vector<int32_t>& slots, int row) {
  const auto all = f.get(b, cache);
  std::vector<float> out;
  for (int32_t s : slots)
    out.insert(out.end(), all.begin() + int64_t(s) * row, all.begin() + int64_t(s + 1) * row);
  return out;
}

TEST(CudaFusedParity, QkvRopeKvWrite) {
  Fixture f;
  for (QkvCase c : {QkvCase{32, 8, 128, 128, false, 1.0f, 1, DType::kBF16, 1, 1},
                    QkvCase{32, 8, 128, 128, false, 1.0f, 37, DType::kBF16, 1, 1},
                    QkvCase{5, 1, 64, 64, true, 1.3f, 7, DType::kBF16, 1, 1},
                    QkvCase{3, 3, 96, 32, false, 0.7f, 5, DType::kBF16, 1, 1},
                    QkvCase{4, 2, 48, 48, true, 1.0f, 3, DType::kFP8E4M3, 0.37f, 2.5f},
                    QkvCase{32, 8, 128, 128, false, 1.0f, 2, DType::kFP8E5M2, 1, 1},
                    QkvCase{6, 2, 64, 40, false, 1.0f, 19, DType::kFP8E4M3, 1, 1}}) {
    const int t = c.tokens, hd = c.head_dim, kvd = c.kv_heads * hd;
    const int width = (c.heads + 2 * c.kv_heads) * hd, page = 16;
    std::vector<float> inv_freq(size_t(c.rotary / 2));
    for (int i = 0; i < c.rotary / 2; ++i)
      inv_freq[size_t(i)] = float(1.0 / std::pow(500000.0, 2.0 * i / c.rotary));
    RopeArgs rope{.inv_freq = inv_freq.data(),
                  .attention_factor = c.factor,
                  .rotary_dim = c.rotary,
                  .offset = 0,
                  .interleaved = c.interleaved};
    std::vector<int32_t> pos(static_cast<size_t>(t)), slots(static_cast<size_t>(t));
    std::uniform_int_distribution<int32_t> d(0, 120000);
    for (auto& x : pos) x = d(f.rng);
    pos[0] = 0;
    const int64_t pages = t / page + 3;
    std::vector<int32_t> perm(static_cast<size_t>(pages * page));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), f.rng);
    std::copy(perm.begin(), perm.begin() + t, slots.begin());
    const int32_t none[1] = {0};
    AttentionMetadata meta{.num_seqs = 0,
                           .num_tokens = t,
                           .page_size = page,
                           .q_indptr = none,
                           .kv_lens = none,
                           .page_indptr = none,
                           .page_indices = none,
                           .positions = pos.data(),
                           .slot_mapping = slots.data()};
    KvLayout lay{.num_layers = 1,
                 .num_pages = pages,
                 .page_size = page,
                 .k_dim = kvd,
                 .v_dim = kvd,
                 .dtype = c.kv_dtype};
    auto qkv_v = f.random(int64_t(t) * width, 2.0f);
    const std::vector<float> nan(size_t(t) * c.heads * hd, NAN);

    auto kv_c = f.cpu->alloc_kv(lay);
    kv_c->set_scales(0, c.k_scale, c.v_scale);
    auto qkv_c = f.up(*f.cpu, qkv_v, {t, width}, DType::kF32);
    auto q_c = f.up(*f.cpu, nan, {t, c.heads, hd}, DType::kF32);
    f.cpu->qkv_rope_kv_write(*qkv_c, c.heads, c.kv_heads, hd, rope, *kv_c, 0, meta, *q_c);

    // GPU: the unfused path, then the fused launch (early trigger on and off) into fresh caches.
    struct Out {
      std::vector<float> q, k, v;
    };
    auto run_gpu = [&](bool fused, bool early) {
      f.cg.tune([&](cuda::CudaTunables& t) {
        t.fusion = fused;
        t.pdl_early = early;
      });
      auto kv_g = f.gpu->alloc_kv(lay);
      kv_g->set_scales(0, c.k_scale, c.v_scale);
      auto qkv_g = f.up(*f.gpu, qkv_v, {t, width}, DType::kBF16);
      auto q_g = f.up(*f.gpu, nan, {t, c.heads, hd}, DType::kBF16);
      f.gpu->qkv_rope_kv_write(*qkv_g, c.heads, c.kv_heads, hd, rope, *kv_g, 0, meta, *q_g);
      return Out{f.get(*f.gpu, *q_g), cache_rows(f, *f.gpu, kv_g->k(0), slots, kvd),
                 cache_rows(f, *f.gpu, kv_g->v(0), slots, kvd)};
    };
    const Out ref = run_gpu(false, false);
    const auto want_q = f.get(*f.cpu, *q_c);
    const auto want_k = cache_rows(f, *f.cpu, kv_c->k(0), slots, kvd);
    const auto want_v = cache_rows(f, *f.cpu, kv_c->v(0), slots, kvd);
    const double kv_bound = c.kv_dtype == DType::kBF16 ? 1e-5 : 1e-3;
    for (bool early : {true, false}) {
      const Out got = run_gpu(true, early);
      EXPECT_TRUE(same_bits(got.q, ref.q)) << "q, heads " << c.heads << " hd " << hd;
      EXPECT_TRUE(same_bits(got.k, ref.k)) << "K cache, " << dtype_name(c.kv_dtype);
      EXPECT_TRUE(same_bits(got.v, ref.v)) << "V cache, " << dtype_name(c.kv_dtype);
      const double eq = nmse(got.q, want_q), ek = nmse(got.k, want_k), ev = nmse(got.v, want_v);
      EXPECT_LT(eq, 1e-5);
      EXPECT_LT(ek, kv_bound) << dtype_name(c.kv_dtype);
      EXPECT_LT(ev, kv_bound) << dtype_name(c.kv_dtype);
      std::printf(
          "qkv_rope_kv_write %d/%d heads hd %d rotary %d%s factor %.1f, %d tokens, KV %s "
          "(scales %.2f/%.2f), early %d: nmse q %.3g K %.3g V %.3g; bits %s the unfused path\n",
          c.heads, c.kv_heads, hd, c.rotary, c.interleaved ? " interleaved" : "", c.factor, t,
          dtype_name(c.kv_dtype), c.k_scale, c.v_scale, int(early), eq, ek, ev,
          same_bits(got.q, ref.q) && same_bits(got.k, ref.k) && same_bits(got.v, ref.v)
              ? "equal"
              : "DIFFER from");
    }
  }
}

}  // namespace
}  // namespace strata
