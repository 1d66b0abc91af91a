// The CUDA backend's fused decode ops against the CPU reference and against the CUDA backend's
// own unfused path (the same kernels' roundings, so the fused launch must give the same bits):
//  - linear_silu_mul (the GEMV with SwiGLU as its epilogue): NMSE against the CPU < 2e-5 (two
//    bf16 roundings, the projection's output and the product, where the CPU rounds none), bit
//    for bit the unfused linear + silu_mul on the GPU, for every GEMV launch variant (4- and
//    8-warp blocks, L2 prefetch, early PDL trigger); row counts past the GEMV (cuBLAS path) and
//    k % 8 != 0 take the default and are checked the same way;
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

namespace strata {
namespace {

struct Fixture {
  std::unique_ptr<Backend> cpu = make_cpu_backend(), gpu = make_cuda_backend();
  cuda::CudaBackend& cg = dynamic_cast<cuda::CudaBackend&>(*gpu);
  std::mt19937 rng{4321};

  std::vector<float> random(int64_t n, float scale = 1.0f) {
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = round_to_bf16(d(rng));
    return v;
  }
  DeviceTensorPtr up(Backend& b, const std::vector<float>& v, const Shape& shape, DType dt) {
    Tensor h = Tensor::make(const_cast<float*>(v.data()), DType::kF32, shape);
    return b.upload(h, dt);
  }
  std::vector<float> get(Backend& b, const Tensor& t) {
    std::vector<float> v(size_t(t.numel()));
    b.download_f32(t, v.data());
    return v;
  }

  // linear_silu_mul's inputs (x [m, k], gate-up weight [2 · inter, k], optional bias) on the GPU
  // and the CPU reference's output.
  struct GluCase {
    int m = 0, inter = 0;
    LinearWeight w;
    DeviceTensorPtr x;
    std::vector<float> want;
  };
  GluCase glu_case(int m, int k, int inter, bool bias) {
    const int64_t n = 2 * int64_t(inter);
    auto xv = random(int64_t(m) * k);
    auto wv = random(n * k, 0.05f);
    auto bv = random(n);
    LinearWeight wc;
    GluCase g;
    g.m = m;
    g.inter = inter;
    wc.weight = up(*cpu, wv, {n, k}, DType::kF32);
    g.w.weight = up(*gpu, wv, {n, k}, DType::kBF16);
    if (bias) {
      wc.bias = up(*cpu, bv, {n}, DType::kF32);
      g.w.bias = up(*gpu, bv, {n}, DType::kF32);
    }
    auto xc = up(*cpu, xv, {m, k}, DType::kF32);
    g.x = up(*gpu, xv, {m, k}, DType::kBF16);
    auto oc = up(*cpu, nans(m, inter), {m, inter}, DType::kF32);
    cpu->linear_silu_mul(*xc, wc, *oc);
    g.want = get(*cpu, *oc);
    return g;
  }
  // The GPU's linear_silu_mul of `g` under the current settings (its output starts as NaN).
  std::vector<float> gpu_glu(const GluCase& g) {
    auto out = up(*gpu, nans(g.m, g.inter), {g.m, g.inter}, DType::kBF16);
    gpu->linear_silu_mul(*g.x, g.w, *out);
    return get(*gpu, *out);
  }
  static std::vector<float> nans(int rows, int cols) {
    return std::vector<float>(size_t(rows) * size_t(cols), NAN);
  }
};

double nmse(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    num += double(got[i] - want[i]) * (got[i] - want[i]);
    den += double(want[i]) * want[i];
  }
  return den > 0 ? num / den : num;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(CudaFusedParity, LinearSiluMul) {
  Fixture f;
  const bool mma0 = cuda::gemv_mma_enabled();
  cuda::set_gemv_mma_enabled(false);  // the FMA GEMV's variants (LinearSiluMulMma: the mma kernel)
  const int max_rows0 = cuda::gemv_max_rows();
  cuda::set_gemv_max_rows(cuda::kGemvMaxRows);  // every m <= 8 on the GEMV (default: m <= 2)
  struct Case {
    int m, k, inter;
    bool bias;
  };
  struct Variant {
    int warps;
    int64_t prefetch;
    bool early;
  };
  const Variant variants[] = {{8, 4096, true}, {8, 0, false}, {4, 4096, true}, {4, 100000, false}};
  for (Case c : {Case{1, 320, 129, false}, Case{3, 896, 517, true}, Case{8, 64, 33, false},
                 Case{1, 4096, 1001, true}, Case{2, 4104, 7, false}, Case{9, 320, 96, true},
                 Case{5, 100, 40, false}, Case{40, 264, 300, true}}) {
    const Fixture::GluCase g = f.glu_case(c.m, c.k, c.inter, c.bias);
    const std::vector<float>& want = g.want;
    // The GPU's unfused path: linear, then silu_mul.
    f.cg.set_fusion(false);
    const auto unfused = f.gpu_glu(g);
    f.cg.set_fusion(true);
    for (const Variant& v : variants) {
      cuda::set_gemv_block_warps(v.warps);
      cuda::set_gemv_prefetch_elems(v.prefetch);
      f.cg.set_pdl_early(v.early);
      const auto got = f.gpu_glu(g);
      const double e = nmse(got, want);
      EXPECT_LT(e, 2e-5) << "m " << c.m << " k " << c.k << " inter " << c.inter;
      EXPECT_TRUE(same_bits(got, unfused))
          << "fused != unfused: m " << c.m << " k " << c.k << " inter " << c.inter << " warps "
          << v.warps << " prefetch " << v.prefetch << " early " << v.early;
      std::printf("linear_silu_mul m=%d k=%d inter=%d bias=%d warps %d prefetch %lld early %d: "
                  "nmse %.3g, bits %s the unfused path\n",
                  c.m, c.k, c.inter, c.bias, v.warps, (long long)v.prefetch, int(v.early), e,
                  same_bits(got, unfused) ? "equal" : "DIFFER from");
    }
  }
  cuda::set_gemv_block_warps(8);  // the defaults
  cuda::set_gemv_prefetch_elems(0);
  f.cg.set_pdl_early(false);
  cuda::set_gemv_max_rows(max_rows0);
  cuda::set_gemv_mma_enabled(mma0);
}

// linear_silu_mul on the tensor-core GEMV (linear_mma.cu: gate rows as tile rows 0-7, up rows
// as 8-15): NMSE against the CPU < 2e-5 and bit for bit the unfused path (the same kernel's plain
// launch, then silu_mul) for every row count it serves, odd k (multiples of 8) and odd inter,
// with and without bias, early PDL trigger on and off, 1 to 8 warps per tile.
TEST(CudaFusedParity, LinearSiluMulMma) {
  Fixture f;
  struct Case {
    int k, inter;
    bool bias;
  };
  const bool mma0 = cuda::gemv_mma_enabled();
  const int per_sm0 = cuda::gemv_mma_warps_per_sm();
  const int min0 = cuda::gemv_mma_min_rows(), max0 = cuda::gemv_mma_max_rows();
  cuda::set_gemv_mma_enabled(true);
  cuda::set_gemv_mma_rows(1, cuda::kGemvMmaMaxRows);
  for (int m : {1, 2, 3, 5, 8, 9, 16, 17, 31, 32, 33, 64}) {
    for (Case c : {Case{264, 1057, true}, Case{1000, 129, false}, Case{8, 7, true},
                   Case{4104, 501, false}}) {
      const Fixture::GluCase g = f.glu_case(m, c.k, c.inter, c.bias);
      const std::vector<float>& want = g.want;
      for (int per_sm : {1, 4, 24}) {
        cuda::set_gemv_mma_warps_per_sm(per_sm);
        f.cg.set_fusion(false);
        const auto unfused = f.gpu_glu(g);
        f.cg.set_fusion(true);
        for (bool early : {false, true}) {
          f.cg.set_pdl_early(early);
          const auto got = f.gpu_glu(g);
          const double e = nmse(got, want);
          const bool same = same_bits(got, unfused);
          // A handful of outputs (k 8, inter 7 at m 1: 7 values) gives no average: each carries up
          // to three bf16 roundings (g, u, the product; ~6e-3 relative), NMSE 2.5e-5 measured.
          const double bound = int64_t(m) * c.inter < 64 ? 4e-5 : 2e-5;
          EXPECT_LT(e, bound) << "m " << m << " k " << c.k << " inter " << c.inter;
          EXPECT_TRUE(same) << "fused != unfused: m " << m << " k " << c.k << " inter " << c.inter
                            << " warps/SM " << per_sm << " early " << early;
          if ((per_sm == 24 && !early) || !same || e >= bound)
            std::printf("linear_silu_mul mma m=%d k=%d inter=%d bias=%d warps/SM %d early %d: "
                        "nmse %.3g, bits %s the unfused path\n",
                        m, c.k, c.inter, c.bias, per_sm, int(early), e,
                        same ? "equal" : "DIFFER from");
        }
      }
    }
  }
  f.cg.set_pdl_early(false);
  cuda::set_gemv_mma_warps_per_sm(per_sm0);
  cuda::set_gemv_mma_rows(min0, max0);
  cuda::set_gemv_mma_enabled(mma0);
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
    RopeArgs rope{.inv_freq = inv_freq.data(), .attention_factor = c.factor,
                  .rotary_dim = c.rotary, .offset = 0, .interleaved = c.interleaved};
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
    AttentionMetadata meta{.num_seqs = 0, .num_tokens = t, .page_size = page, .q_indptr = none,
                           .kv_lens = none, .page_indptr = none, .page_indices = none,
                           .positions = pos.data(), .slot_mapping = slots.data()};
    KvLayout lay{.num_layers = 1, .num_pages = pages, .page_size = page, .k_dim = kvd,
                 .v_dim = kvd, .dtype = c.kv_dtype};
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
      f.cg.set_fusion(fused);
      f.cg.set_pdl_early(early);
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
      std::printf("qkv_rope_kv_write %d/%d heads hd %d rotary %d%s factor %.1f, %d tokens, KV %s "
                  "(scales %.2f/%.2f), early %d: nmse q %.3g K %.3g V %.3g; bits %s the unfused path\n",
                  c.heads, c.kv_heads, hd, c.rotary, c.interleaved ? " interleaved" : "", c.factor,
                  t, dtype_name(c.kv_dtype), c.k_scale, c.v_scale, int(early), eq, ek, ev,
                  same_bits(got.q, ref.q) && same_bits(got.k, ref.k) && same_bits(got.v, ref.v)
                      ? "equal"
                      : "DIFFER from");
    }
  }
  f.cg.set_fusion(true);
  f.cg.set_pdl_early(false);
}

}  // namespace
}  // namespace strata
