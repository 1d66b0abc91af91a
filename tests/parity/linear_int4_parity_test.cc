// The W4A16 (INT4) linears of backend/cuda/linear_int4.h against host references, on raw device
// buffers: random checkpoint tensors in compressed-tensors' pack-quantized layout (weight_packed
// int32 [n, k/8], weight_scale bf16 [n, k/group]), odd and realistic shapes, groups 32/64/128,
// with and without bias.
//
// References and bounds:
// - repack: the device layout rebuilt here from its documentation (linear_int4.cu), byte for
//   byte, padding included.
// - dequant: bit for bit the CPU twin's weights (model/quant.h dequant_int4_pack_quantized: the
//   exact product (nibble - 8) · scale rounded once to bf16, which the kernels compute too).
// - GEMV / GEMM: NMSE = ‖gpu − ref‖² / ‖ref‖² against float64 x · Wᵀ (+ bias), W those same
//   weights (the register and stream GEMVs' default, gemv_round = 0: the unrounded
//   (nibble − 8) · scale they compute with, exact in float32; their NMSE against the rounded
//   weights is printed too, ~1e-6 more) and x the bf16 inputs. Weights and products are then exact
//   on both sides; what differs is the float32 accumulation order (relative error ~k · 2⁻²⁴ at
//   worst, < 1e-9 in NMSE) and the output's rounding to bf16: uniform in ±half an ulp = 2⁻⁹
//   relative at the bottom of a binade, NMSE ≈ 2⁻¹⁴ / 12 / E[(v / 2^e)²] ≈ 5.1e-6 / 2.2 ≈ 2.4e-6
//   (the bf16 GEMV's measured 2.4e-6 to 3.0e-6). Bound 1e-5; the smallest case has 32 outputs, and
//   the worst of 20,000 random draws of 16 normal values rounded to bf16 was 9.7e-6. A wrong nibble
//   order, scale, tile or token gives ~0.1 to 2; an output not written keeps its NaN poison:
//   infinite NMSE.
// - SwiGLU epilogue: the reference rounds g + bias and u + bias to bf16 as the kernel (and
//   launch_silu_mul after an unfused linear) does, then silu(g) · u in float64: the output's
//   rounding again, plus 1-ulp flips of g or u where the accumulation order straddles a rounding
//   boundary (probability ~1e-3, each ~2⁻¹⁶ relative squared): bound 1e-5.
// Each output buffer is poisoned (0xff bytes: bf16 NaN) with a guard of 256 elements after it
// that must stay poisoned (no write past the output).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "backend/cuda/linear_int4.h"
#include "core/dtype.h"
#include "core/thread_pool.h"
#include "model/quant.h"
#include "support/device_buffer.h"

namespace strata {
namespace {

using cuda::bf16_bits;

using testing::Dev;
using testing::download;
using testing::poisoned_output;
using testing::read_output;
using testing::Stream;
using testing::upload;

struct Shape {
  int64_t n, k;
  int group;
};

// A random INT4 weight: the checkpoint tensors, the CPU twin's dequantized values and the device
// layout made by launch_int4_repack.
struct Int4Weight {
  Shape sh;
  std::vector<int32_t> packed;  // [n, k / 8]
  std::vector<uint16_t> scale;  // [n, k / group]
  std::vector<float> w;         // [n, k]
  std::vector<float> w_exact;   // [n, k]: (nibble - 8) · scale unrounded (exact in float32)
  std::unique_ptr<Dev> dev_packed, dev_scale;
};

Int4Weight make_weight(std::mt19937& rng, Shape sh, const Stream& s) {
  Int4Weight w;
  w.sh = sh;
  w.packed.resize(size_t(sh.n * (sh.k / 8)));
  for (int32_t& v : w.packed) v = int32_t(rng());  // uniform nibbles 0..15
  std::uniform_real_distribution<float> mag(0.004f, 0.03f);
  w.scale.resize(size_t(sh.n * (sh.k / sh.group)));
  for (uint16_t& v : w.scale) v = f32_to_bf16(rng() % 8 == 0 ? -mag(rng) : mag(rng));
  w.w.resize(size_t(sh.n * sh.k));
  dequant_int4_pack_quantized(reinterpret_cast<const uint8_t*>(w.packed.data()), sh.k / 8,
                              reinterpret_cast<const uint8_t*>(w.scale.data()), sh.n, sh.k,
                              sh.group, w.w.data());
  w.w_exact.resize(w.w.size());
  for (int64_t r = 0; r < sh.n; ++r)
    for (int64_t i = 0; i < sh.k; ++i) {
      const uint32_t word = uint32_t(w.packed[size_t(r * (sh.k / 8) + i / 8)]);
      const int nib = int((word >> (4 * (i % 8))) & 0xfu) - 8;
      w.w_exact[size_t(r * sh.k + i)] =
          float(nib) * bf16_to_f32(w.scale[size_t(r * (sh.k / sh.group) + i / sh.group)]);
    }
  auto src_packed = upload(w.packed, s);
  auto src_scale = upload(w.scale, s);
  w.dev_packed = std::make_unique<Dev>(size_t(cuda::int4_packed_bytes(sh.n, sh.k)));
  w.dev_scale = std::make_unique<Dev>(size_t(cuda::int4_scale_bytes(sh.n, sh.k, sh.group)));
  CUDA_CHECK(cudaMemsetAsync(w.dev_packed->as<void>(), 0x5a, w.dev_packed->bytes(), s.get()));
  CUDA_CHECK(cudaMemsetAsync(w.dev_scale->as<void>(), 0x5a, w.dev_scale->bytes(), s.get()));
  cuda::Int4RepackParams p{};
  p.src_packed = src_packed->as<int32_t>();
  p.src_scale = src_scale->as<bf16_bits>();
  p.dst_packed = w.dev_packed->as<void>();
  p.dst_scale = w.dev_scale->as<bf16_bits>();
  p.n = sh.n;
  p.k = sh.k;
  p.src_cols = sh.k / 8;
  p.group = sh.group;
  cuda::launch_int4_repack(p, s.get());
  s.sync();
  return w;
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

// out [m, n] = x [m, k] · wᵀ (+ bias) in float64.
std::vector<double> host_linear(const std::vector<float>& x, int64_t m, const std::vector<float>& w,
                                int64_t n, int64_t k, const std::vector<float>* bias) {
  std::vector<double> out(size_t(m * n));
  parallel_for(n, 8, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* wr = w.data() + r * k;
      for (int64_t t = 0; t < m; ++t) {
        const float* xt = x.data() + t * k;
        double s = 0;
        for (int64_t i = 0; i < k; ++i) s += double(xt[i]) * double(wr[i]);
        out[size_t(t * n + r)] = s + (bias ? double((*bias)[size_t(r)]) : 0.0);
      }
    }
  });
  return out;
}

double nmse(const std::vector<uint16_t>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double g = bf16_to_f32(got[i]);
    if (!std::isfinite(g)) return INFINITY;
    num += (g - want[i]) * (g - want[i]);
    den += want[i] * want[i];
  }
  return den > 0 ? num / den : num;
}

// ---- the device layout, rebuilt from its documentation (linear_int4.cu) ----
// Tiles of 16 rows × 64 columns, [row tile][k tile], 512 bytes; lane l = 4g + c owns bytes
// 16l..16l+15, word s of them (k step s, tile columns 16s..16s+15) holds, with j = 16s + 2c,
// nibbles n0..n7 = W[g][j], W[g+8][j], W[g][j+8], W[g+8][j+8], W[g][j+1], W[g+8][j+1], W[g][j+9],
// W[g+8][j+9] (least significant first). Out of range: nibble 8 (zero). Scales: [row tile]
// [group][16], tile row r at slot 2·(r % 8) + r / 8; out of range 0.
std::vector<uint8_t> host_layout_packed(const Int4Weight& w) {
  const int64_t n = w.sh.n, k = w.sh.k, rts = (n + 15) / 16, kts = (k + 63) / 64;
  std::vector<uint8_t> out(size_t(rts * kts * 512));
  auto nibble = [&](int64_t r, int64_t col) -> uint32_t {
    if (r >= n || col >= k) return 8;
    return (uint32_t(w.packed[size_t(r * (k / 8) + col / 8)]) >> (4 * (col % 8))) & 0xfu;
  };
  for (int64_t rt = 0; rt < rts; ++rt)
    for (int64_t kt = 0; kt < kts; ++kt)
      for (int lane = 0; lane < 32; ++lane)
        for (int s = 0; s < 4; ++s) {
          const int g = lane / 4, c = lane % 4, j = 16 * s + 2 * c;
          const int rows[8] = {g, g + 8, g, g + 8, g, g + 8, g, g + 8};
          const int cols[8] = {j, j, j + 8, j + 8, j + 1, j + 1, j + 9, j + 9};
          uint32_t word = 0;
          for (int i = 0; i < 8; ++i)
            word |= nibble(rt * 16 + rows[i], kt * 64 + cols[i]) << (4 * i);
          std::memcpy(&out[size_t(((rt * kts + kt) * 32 + lane) * 16 + 4 * s)], &word, 4);
        }
  return out;
}
std::vector<uint16_t> host_layout_scale(const Int4Weight& w) {
  const int64_t n = w.sh.n, k = w.sh.k, rts = (n + 15) / 16;
  const int64_t groups = ((k + 63) / 64 * 64 + w.sh.group - 1) / w.sh.group,
                src_groups = k / w.sh.group;
  std::vector<uint16_t> out(size_t(rts * groups * 16), 0);
  for (int64_t rt = 0; rt < rts; ++rt)
    for (int64_t gi = 0; gi < groups; ++gi)
      for (int r = 0; r < 16; ++r) {
        const int64_t row = rt * 16 + r;
        if (row < n && gi < src_groups)
          out[size_t((rt * groups + gi) * 16 + 2 * (r % 8) + r / 8)] =
              w.scale[size_t(row * src_groups + gi)];
      }
  return out;
}

// Odd shapes: n not a multiple of 16 (a partial row tile), k = 4,128 an odd multiple of 32 (a
// half-empty last k tile and a padded scale group), k not a multiple of 256; and one of each
// group with both dims aligned.
const Shape kOddShapes[] = {{517, 4128, 32}, {1000, 4160, 64}, {129, 2944, 128},
                            {16, 64, 32},    {33, 96, 32},     {64, 256, 128}};

TEST(Int4Parity, RepackLayout) {
  Stream s;
  std::mt19937 rng(11);
  for (Shape sh : kOddShapes) {
    Int4Weight w = make_weight(rng, sh, s);
    const auto want_p = host_layout_packed(w);
    const auto want_s = host_layout_scale(w);
    ASSERT_EQ(want_p.size(), size_t(cuda::int4_packed_bytes(sh.n, sh.k)));
    ASSERT_EQ(want_s.size() * 2, size_t(cuda::int4_scale_bytes(sh.n, sh.k, sh.group)));
    const auto got_p = download<uint8_t>(*w.dev_packed, want_p.size(), s);
    const auto got_s = download<uint16_t>(*w.dev_scale, want_s.size(), s);
    int64_t bad_p = 0, bad_s = 0;
    for (size_t i = 0; i < want_p.size(); ++i) bad_p += got_p[i] != want_p[i];
    for (size_t i = 0; i < want_s.size(); ++i) bad_s += got_s[i] != want_s[i];
    EXPECT_EQ(bad_p, 0) << "packed bytes differ, n " << sh.n << " k " << sh.k << " group "
                        << sh.group;
    EXPECT_EQ(bad_s, 0) << "scales differ, n " << sh.n << " k " << sh.k << " group " << sh.group;
    if (sh.n % 16 == 0 && sh.k % 64 == 0) {  // the checkpoint's bytes, no padding
      EXPECT_EQ(cuda::int4_packed_bytes(sh.n, sh.k), sh.n * sh.k / 2);
      EXPECT_EQ(cuda::int4_scale_bytes(sh.n, sh.k, sh.group), sh.n * (sh.k / sh.group) * 2);
    }
  }
}

TEST(Int4Parity, DequantBf16) {
  Stream s;
  std::mt19937 rng(12);
  for (Shape sh : kOddShapes) {
    Int4Weight w = make_weight(rng, sh, s);
    auto out = poisoned_output(sh.n * sh.k, s);
    cuda::Int4DequantParams p{};
    p.packed = w.dev_packed->as<void>();
    p.scale = w.dev_scale->as<bf16_bits>();
    p.out = out->as<bf16_bits>();
    p.n = sh.n;
    p.k = sh.k;
    p.group = sh.group;
    cuda::launch_int4_dequant_bf16(p, s.get());
    bool guard_ok = false;
    const auto got = read_output(*out, sh.n * sh.k, s, &guard_ok);
    int64_t bad = 0;
    for (size_t i = 0; i < got.size(); ++i) bad += got[i] != f32_to_bf16(w.w[i]);
    EXPECT_EQ(bad, 0) << "n " << sh.n << " k " << sh.k << " group " << sh.group;
    EXPECT_TRUE(guard_ok) << "wrote past the output, n " << sh.n << " k " << sh.k;
  }
}

struct RunOpts {
  bool gemm = false;
  int gemv_ksplit = 0, gemm_tokens = 0, gemm_ksplit = 0, preload = 0, pdl_early = 0;
  int gemv_kernel = 0, gemv_warps = 0, gemv_stages = 0, gemv_chunk = 0, gemv_grid = 0,
      gemv_round = 0, gemv_unroll = 0, gemv_trigger = 0, gemv_depth = 0, gemv_rows = 0,
      gemv_x_tma = 0;
  // The reference's weights: the unrounded products (the stream GEMV's gemv_round = 0) or the
  // bf16-rounded ones.
  bool exact_ref = false;
};
void apply(const RunOpts& o, cuda::Int4LinearParams* p) {
  p->gemv_ksplit = o.gemv_ksplit;
  p->gemm_tokens = o.gemm_tokens;
  p->gemm_ksplit = o.gemm_ksplit;
  p->preload = o.preload;
  p->pdl_early = o.pdl_early;
  p->gemv_kernel = o.gemv_kernel;
  p->gemv_warps = o.gemv_warps;
  p->gemv_stages = o.gemv_stages;
  p->gemv_chunk = o.gemv_chunk;
  p->gemv_grid = o.gemv_grid;
  p->gemv_round = o.gemv_round;
  p->gemv_unroll = o.gemv_unroll;
  p->gemv_trigger = o.gemv_trigger;
  p->gemv_depth = o.gemv_depth;
  p->gemv_rows = o.gemv_rows;
  p->gemv_x_tma = o.gemv_x_tma;
}
// o's launch parameters for an [n, k] weight at m rows (no buffers: for the fit queries).
cuda::Int4LinearParams shape_params(const RunOpts& o, int64_t m, int64_t n, int64_t k, int group,
                                    int64_t inter) {
  cuda::Int4LinearParams p{};
  p.m = m;
  p.n = n;
  p.k = k;
  p.group = group;
  p.glu_inter = inter;
  apply(o, &p);
  return p;
}
// Whether launch_int4_gemv can take o on an [n, k] weight at m rows (a forced stream or register
// configuration may need more shared memory than there is).
bool gemv_fits(const RunOpts& o, int64_t m, int64_t n, int64_t k, int group, int64_t inter = 0) {
  const cuda::Int4LinearParams p = shape_params(o, m, n, k, group, inter);
  if (o.gemv_kernel == cuda::kInt4GemvStream) return cuda::int4_gemv_stream_fits(p);
  if (o.gemv_kernel == cuda::kInt4GemvReg) return cuda::int4_gemv_reg_fits(p);
  return true;
}

// One linear (GEMV or GEMM) on m random rows; returns the NMSE against the float64 reference
// (o.exact_ref: on the unrounded weights; *rounded_nmse, if given, against the rounded ones).
double run_linear(std::mt19937& rng, const Int4Weight& w, int64_t m, bool with_bias, RunOpts o,
                  const Stream& s, double* rounded_nmse = nullptr) {
  const int64_t n = w.sh.n, k = w.sh.k;
  const auto x = random_bf16(rng, m * k, 1.0f);
  std::vector<float> bias = random_bf16(rng, n, 0.5f);
  auto dx = upload(to_bits(x), s);
  auto dbias = upload(bias, s);
  auto out = poisoned_output(m * n, s);
  cuda::Int4LinearParams p{};
  p.x = dx->as<bf16_bits>();
  p.packed = w.dev_packed->as<void>();
  p.scale = w.dev_scale->as<bf16_bits>();
  p.bias = with_bias ? dbias->as<float>() : nullptr;
  p.out = out->as<bf16_bits>();
  p.m = m;
  p.n = n;
  p.k = k;
  p.group = w.sh.group;
  apply(o, &p);
  if (o.gemm)
    cuda::launch_int4_gemm(p, s.get());
  else
    cuda::launch_int4_gemv(p, s.get());
  bool guard_ok = false;
  const auto got = read_output(*out, m * n, s, &guard_ok);
  EXPECT_TRUE(guard_ok) << (o.gemm ? "gemm" : "gemv") << " wrote past the output: m " << m << " n "
                        << n << " k " << k;
  if (rounded_nmse && o.exact_ref)
    *rounded_nmse = nmse(got, host_linear(x, m, w.w, n, k, with_bias ? &bias : nullptr));
  return nmse(got,
              host_linear(x, m, o.exact_ref ? w.w_exact : w.w, n, k, with_bias ? &bias : nullptr));
}

// The mma GEMV (forced: launch_int4_gemv would take the register GEMV for m <= 8): every row
// count class (1, 2, 4 n tiles of 8 tokens, partial ones included), every group, odd shapes with
// 1, 2, 4, 8 warps per tile and the automatic split, the weight preload before the PDL wait on
// and off; every m from 1 to 32 on the first shape; the 8B qkv shape.
TEST(Int4Parity, Gemv) {
  Stream s;
  std::mt19937 rng(13);
  std::vector<int64_t> all_m;
  for (int64_t m = 1; m <= 32; ++m) all_m.push_back(m);
  bool first = true;
  for (Shape sh :
       {Shape{517, 4128, 32}, Shape{1000, 4160, 64}, Shape{129, 2944, 128}, Shape{33, 96, 32}}) {
    Int4Weight w = make_weight(rng, sh, s);
    for (int ks : {0, 1, 2, 4, 8}) {
      const bool every_m = first && ks == 0;
      for (int64_t m : every_m ? all_m : std::vector<int64_t>{1, 2, 3, 7, 8, 16, 17, 32}) {
        RunOpts o;
        o.gemv_kernel = cuda::kInt4GemvMma;
        o.gemv_ksplit = ks;
        o.preload = int(m % 2);
        o.pdl_early = int(m == 3);
        const bool bias = (m + ks) % 2 == 0;
        const double e = run_linear(rng, w, m, bias, o, s);
        EXPECT_LT(e, 1e-5) << "gemv ksplit " << ks << " m " << m << " n " << sh.n << " k " << sh.k
                           << " group " << sh.group << " bias " << bias;
        if (ks == 0 || e >= 1e-5)
          std::printf("int4 gemv ksplit=%d m=%lld n=%lld k=%lld group=%d bias=%d nmse %.3g\n", ks,
                      (long long)m, (long long)sh.n, (long long)sh.k, sh.group, int(bias), e);
      }
    }
    first = false;
  }
  Int4Weight qkv = make_weight(rng, Shape{6144, 4096, 128}, s);
  for (int64_t m : {1, 16}) {
    RunOpts o;
    o.gemv_kernel = cuda::kInt4GemvMma;
    o.preload = 1;
    const double e = run_linear(rng, qkv, m, false, o, s);
    EXPECT_LT(e, 1e-5) << "gemv 8B qkv m " << m;
    std::printf("int4 gemv 8B qkv m=%lld nmse %.3g\n", (long long)m, e);
  }
}

// The GEMM: every kernel (64/128-token tiles, rows or k split between the warpgroups) on odd
// shapes and row counts from 1 (partial token tiles, one and several) to 200, then the automatic
// choice on the 8B o_proj shape.
TEST(Int4Parity, Gemm) {
  Stream s;
  std::mt19937 rng(14);
  struct Cfg {
    int tokens, ksplit;
  };
  for (Shape sh :
       {Shape{517, 4128, 32}, Shape{1000, 4160, 64}, Shape{129, 2944, 128}, Shape{33, 96, 32}}) {
    Int4Weight w = make_weight(rng, sh, s);
    for (Cfg cfg : {Cfg{0, 0}, Cfg{64, 1}, Cfg{64, 2}, Cfg{128, 1}, Cfg{128, 2}}) {
      for (int64_t m : {1, 2, 3, 7, 16, 17, 33, 64, 65, 200}) {
        RunOpts o;
        o.gemm = true;
        o.gemm_tokens = cfg.tokens;
        o.gemm_ksplit = cfg.ksplit;
        o.pdl_early = int(m == 7);
        const bool bias = m % 2 == 1;
        const double e = run_linear(rng, w, m, bias, o, s);
        EXPECT_LT(e, 1e-5) << "gemm tokens " << cfg.tokens << " ksplit " << cfg.ksplit << " m " << m
                           << " n " << sh.n << " k " << sh.k << " group " << sh.group;
        if (cfg.tokens == 0 || e >= 1e-5)
          std::printf("int4 gemm tokens=%d ksplit=%d m=%lld n=%lld k=%lld group=%d nmse %.3g\n",
                      cfg.tokens, cfg.ksplit, (long long)m, (long long)sh.n, (long long)sh.k,
                      sh.group, e);
      }
    }
  }
  Int4Weight o_proj = make_weight(rng, Shape{4096, 4096, 128}, s);
  for (int64_t m : {33, 200, 520}) {
    RunOpts o;
    o.gemm = true;
    const double e = run_linear(rng, o_proj, m, true, o, s);
    EXPECT_LT(e, 1e-5) << "gemm 8B o_proj m " << m;
    std::printf("int4 gemm 8B o_proj m=%lld nmse %.3g\n", (long long)m, e);
  }
}

// The GEMV's SwiGLU epilogue on a fused gate-up weight [2 · inter, k] (n = 2 · inter) on m
// random rows: NMSE against silu(g) · u with g, u the float64 products (+ bias) rounded to bf16
// as the kernels round them.
double run_swiglu(std::mt19937& rng, const Int4Weight& w, int64_t m, bool with_bias,
                  const RunOpts& o, const Stream& s) {
  const Shape sh = w.sh;
  const int64_t inter = sh.n / 2, k = sh.k;
  const auto x = random_bf16(rng, m * k, 1.0f);
  const auto bias = random_bf16(rng, sh.n, 0.5f);
  auto dx = upload(to_bits(x), s);
  auto dbias = upload(bias, s);
  auto out = poisoned_output(m * inter, s);
  cuda::Int4LinearParams p{};
  p.x = dx->as<bf16_bits>();
  p.packed = w.dev_packed->as<void>();
  p.scale = w.dev_scale->as<bf16_bits>();
  p.bias = with_bias ? dbias->as<float>() : nullptr;
  p.out = out->as<bf16_bits>();
  p.m = m;
  p.n = sh.n;
  p.k = k;
  p.glu_inter = inter;
  p.group = sh.group;
  apply(o, &p);
  cuda::launch_int4_gemv(p, s.get());
  bool guard_ok = false;
  const auto got = read_output(*out, m * inter, s, &guard_ok);
  EXPECT_TRUE(guard_ok) << "swiglu wrote past the output, m " << m;
  const auto gu =
      host_linear(x, m, o.exact_ref ? w.w_exact : w.w, sh.n, k, with_bias ? &bias : nullptr);
  std::vector<double> want(size_t(m * inter));
  for (int64_t t = 0; t < m; ++t)
    for (int64_t j = 0; j < inter; ++j) {
      const double g = round_to_bf16(float(gu[size_t(t * sh.n + j)]));
      const double u = round_to_bf16(float(gu[size_t(t * sh.n + inter + j)]));
      want[size_t(t * inter + j)] = g / (1.0 + std::exp(-g)) * u;
    }
  return nmse(got, want);
}

// The mma GEMV's SwiGLU epilogue (forced), m from 1 to 32.
TEST(Int4Parity, GemvSwiGlu) {
  Stream s;
  std::mt19937 rng(15);
  for (Shape sh : {Shape{2 * 592, 4128, 32}, Shape{2 * 2048, 2944, 128}, Shape{2 * 32, 64, 32}}) {
    Int4Weight w = make_weight(rng, sh, s);
    for (int ks : {0, 1, 8}) {
      for (int64_t m : {1, 3, 8, 16, 17, 32}) {
        RunOpts o;
        o.gemv_kernel = cuda::kInt4GemvMma;
        o.gemv_ksplit = ks;
        o.preload = int(m % 2 == 0);
        const double e = run_swiglu(rng, w, m, m % 2 == 1, o, s);
        EXPECT_LT(e, 1e-5) << "swiglu ksplit " << ks << " m " << m << " inter " << sh.n / 2 << " k "
                           << sh.k;
        if (ks == 0 || e >= 1e-5)
          std::printf("int4 gemv+swiglu ksplit=%d m=%lld inter=%lld k=%lld group=%d nmse %.3g\n",
                      ks, (long long)m, (long long)sh.n / 2, (long long)sh.k, sh.group, e);
      }
    }
  }
}

// ---- the stream GEMV (linear_int4_stream.cu) ----
// Knob sets: defaults; one warp (a block's whole stream in one part); 16 warps of 8-tile stages,
// more warps than groups on the small shapes (empty parts); single-stage and two-stage rings;
// 1, 3 and 7 blocks (many row tiles per block, parts crossing row tiles); the rounded-weight
// variant with each chunk size; the preload and the early trigger off and on.
struct StreamKnobs {
  int warps, stages, chunk, grid, round, preload, early;
};
const StreamKnobs kStreamKnobs[] = {
    {0, 0, 0, 0, 0, 1, 0}, {1, 2, 4, 0, 0, 0, 0}, {16, 0, 8, 0, 0, 1, 1}, {4, 1, 4, 3, 0, 1, 0},
    {8, 2, 8, 1, 0, 0, 1}, {7, 3, 4, 7, 0, 1, 0}, {0, 0, 4, 0, 1, 1, 0},  {16, 2, 8, 3, 1, 0, 0},
};
RunOpts stream_opts(const StreamKnobs& k) {
  RunOpts o;
  o.gemv_kernel = cuda::kInt4GemvStream;
  o.gemv_warps = k.warps;
  o.gemv_stages = k.stages;
  o.gemv_chunk = k.chunk;
  o.gemv_grid = k.grid;
  o.gemv_round = k.round;
  o.preload = k.preload;
  o.pdl_early = k.early;
  o.exact_ref = k.round == 0;
  return o;
}

// Odd shapes (a partial row tile, k % 64 == 32, groups 32 to 256), every m from 1 to 8, every
// knob set; the 8B qkv and down shapes at m = 1 and their largest m that fits.
TEST(Int4Parity, GemvStream) {
  Stream s;
  std::mt19937 rng(16);
  for (Shape sh : {Shape{517, 4128, 32}, Shape{1000, 4160, 64}, Shape{129, 2944, 128},
                   Shape{33, 96, 32}, Shape{16, 64, 32}, Shape{272, 2560, 256}}) {
    Int4Weight w = make_weight(rng, sh, s);
    for (size_t ki = 0; ki < std::size(kStreamKnobs); ++ki) {
      for (int64_t m = 1; m <= 8; ++m) {
        if (ki > 0 && m % 3 != 1 && m != 8) continue;  // every m on the defaults only
        const RunOpts o = stream_opts(kStreamKnobs[ki]);
        // A forced ring may not fit beside a large x (16 warps of 2-stage rings, k = 4,128 and
        // m = 8: 230 KB); the defaults always do (the ring shrinks).
        if (!gemv_fits(o, m, sh.n, sh.k, sh.group)) {
          EXPECT_NE(ki, 0u) << "defaults do not fit: m " << m << " k " << sh.k;
          std::printf("int4 stream knobs=%zu m=%lld k=%lld: does not fit, skipped\n", ki,
                      (long long)m, (long long)sh.k);
          continue;
        }
        const bool bias = (m + int64_t(ki)) % 2 == 0;
        double rounded = 0;
        const double e = run_linear(rng, w, m, bias, o, s, &rounded);
        EXPECT_LT(e, 1e-5) << "stream knobs " << ki << " m " << m << " n " << sh.n << " k " << sh.k
                           << " group " << sh.group << " bias " << bias;
        if (ki == 0 || e >= 1e-5)
          std::printf(
              "int4 stream knobs=%zu m=%lld n=%lld k=%lld group=%d bias=%d nmse %.3g (vs rounded "
              "weights %.3g)\n",
              ki, (long long)m, (long long)sh.n, (long long)sh.k, sh.group, int(bias), e, rounded);
      }
    }
  }
  for (Shape sh : {Shape{6144, 4096, 128}, Shape{4096, 14336, 128}}) {
    Int4Weight w = make_weight(rng, sh, s);
    for (int64_t m : {int64_t(1), sh.k == 4096 ? int64_t(8) : int64_t(6)}) {
      for (int round : {0, 1}) {
        RunOpts o = stream_opts(kStreamKnobs[0]);
        o.gemv_round = round;
        o.exact_ref = round == 0;
        double rounded = 0;
        const double e = run_linear(rng, w, m, false, o, s, &rounded);
        EXPECT_LT(e, 1e-5) << "stream 8B n " << sh.n << " k " << sh.k << " m " << m;
        std::printf("int4 stream 8B n=%lld k=%lld m=%lld round=%d nmse %.3g (vs rounded %.3g)\n",
                    (long long)sh.n, (long long)sh.k, (long long)m, round, e, rounded);
      }
    }
  }
}

TEST(Int4Parity, GemvStreamSwiGlu) {
  Stream s;
  std::mt19937 rng(17);
  for (Shape sh : {Shape{2 * 592, 4128, 32}, Shape{2 * 2048, 2944, 128}, Shape{2 * 32, 64, 32},
                   Shape{2 * 14336, 4096, 128}}) {
    Int4Weight w = make_weight(rng, sh, s);
    for (size_t ki = 0; ki < std::size(kStreamKnobs); ++ki) {
      for (int64_t m : {1, 3, 8}) {
        if (sh.n > 20000 && (ki % 3 != 0 || m == 3)) continue;  // the 8B gate_up: a few
        const RunOpts o = stream_opts(kStreamKnobs[ki]);
        if (!gemv_fits(o, m, sh.n, sh.k, sh.group, sh.n / 2)) {
          EXPECT_NE(ki, 0u) << "defaults do not fit: m " << m << " k " << sh.k;
          continue;
        }
        const double e = run_swiglu(rng, w, m, m % 2 == 1, o, s);
        EXPECT_LT(e, 1e-5) << "stream swiglu knobs " << ki << " m " << m << " inter " << sh.n / 2
                           << " k " << sh.k;
        if (ki == 0 || e >= 1e-5)
          std::printf("int4 stream+swiglu knobs=%zu m=%lld inter=%lld k=%lld group=%d nmse %.3g\n",
                      ki, (long long)m, (long long)sh.n / 2, (long long)sh.k, sh.group, e);
      }
    }
  }
}

// ---- the register GEMV (linear_int4_reg.cu), launch_int4_gemv's default for m <= 8 ----
// Knob sets: defaults; one warp (a block's whole stream in one part); 7 warps of a ring of 8 on
// 3 blocks (parts crossing row tiles, many row tiles per block); each trigger point; residency
// depth 1 and 2; one block (every row tile in it); the rounded-weight variant with each ring
// size; the preload off; four row tiles a k tile (rows 4: ring 8, unrounded and rounded, one
// warp, many blocks, parts that cut super-slots, the trigger late); x by one bulk copy (x_tma:
// the backend's ring 8, rows 4 rounded, the preload off with the trigger late).
constexpr int kXTma = 1 << 18;  // every shape here
struct RegKnobs {
  int warps, unroll, grid, trigger, depth, round, preload, rows = 0, x_tma = 0;
};
const RegKnobs kRegKnobs[] = {
    {0, 0, 0, 0, 0, 0, 1},           {1, 16, 0, 0, 0, 0, 1},
    {7, 8, 3, 1, 0, 0, 1},           {4, 16, 0, 2, 1, 0, 1},
    {8, 8, 0, 3, 2, 0, 1},           {3, 16, 1, 0, 0, 0, 1},
    {0, 8, 0, 0, 0, 1, 1},           {0, 16, 2, 3, 0, 1, 0},
    {5, 0, 0, 0, 2, 0, 0},           {0, 8, 0, 0, 0, 0, 1, 4},
    {7, 8, 3, 1, 0, 1, 1, 4},        {1, 8, 0, 3, 0, 0, 1, 4},
    {3, 8, 64, 2, 0, 1, 0, 4},       {0, 8, 0, 0, 0, 0, 1, 0, kXTma},
    {7, 8, 3, 1, 0, 1, 1, 4, kXTma}, {0, 16, 0, 3, 0, 1, 0, 0, kXTma},
};
RunOpts reg_opts(const RegKnobs& k) {
  RunOpts o;
  o.gemv_kernel = cuda::kInt4GemvReg;
  o.gemv_warps = k.warps;
  o.gemv_unroll = k.unroll;
  o.gemv_grid = k.grid;
  o.gemv_trigger = k.trigger;
  o.gemv_depth = k.depth;
  o.gemv_round = k.round;
  o.preload = k.preload;
  o.gemv_rows = k.rows;
  o.gemv_x_tma = k.x_tma;
  o.exact_ref = k.round == 0;
  return o;
}
// The row tiles a position the register GEMV runs o with: knobs asking for 4 get 4 wherever
// the kernel is instantiated (group <= 128), so those rows test what they name.
void expect_rows(const RunOpts& o, int64_t m, int64_t n, int64_t k, int group, int64_t inter = 0) {
  EXPECT_EQ(cuda::int4_gemv_reg_rows(shape_params(o, m, n, k, group, inter)),
            o.gemv_rows == 4 && group <= 128 ? 4 : 1)
      << "n " << n << " k " << k << " group " << group;
  EXPECT_EQ(cuda::int4_gemv_reg_x_tma(shape_params(o, m, n, k, group, inter)), o.gemv_x_tma > 0)
      << "n " << n << " k " << k << " m " << m;
}

// Odd shapes (a partial row tile, k % 64 == 32, groups 32 to 256), every m from 1 to 8 on the
// defaults, every knob set; the 8B qkv and down shapes at m = 1 and their largest m that fits,
// through launch_int4_gemv's automatic choice (which must be this kernel).
TEST(Int4Parity, GemvReg) {
  Stream s;
  std::mt19937 rng(18);
  for (Shape sh : {Shape{517, 4128, 32}, Shape{1000, 4160, 64}, Shape{129, 2944, 128},
                   Shape{33, 96, 32}, Shape{16, 64, 32}, Shape{272, 2560, 256}}) {
    Int4Weight w = make_weight(rng, sh, s);
    for (size_t ki = 0; ki < std::size(kRegKnobs); ++ki) {
      for (int64_t m = 1; m <= 8; ++m) {
        if (ki > 0 && m % 3 != 1 && m != 8) continue;  // every m on the defaults only
        const RunOpts o = reg_opts(kRegKnobs[ki]);
        ASSERT_TRUE(gemv_fits(o, m, sh.n, sh.k, sh.group)) << "knobs " << ki << " m " << m;
        expect_rows(o, m, sh.n, sh.k, sh.group);
        const bool bias = (m + int64_t(ki)) % 2 == 1;
        double rounded = 0;
        const double e = run_linear(rng, w, m, bias, o, s, &rounded);
        EXPECT_LT(e, 1e-5) << "reg knobs " << ki << " m " << m << " n " << sh.n << " k " << sh.k
                           << " group " << sh.group << " bias " << bias;
        if (ki == 0 || e >= 1e-5)
          std::printf(
              "int4 reg knobs=%zu m=%lld n=%lld k=%lld group=%d bias=%d nmse %.3g (vs rounded "
              "weights %.3g)\n",
              ki, (long long)m, (long long)sh.n, (long long)sh.k, sh.group, int(bias), e, rounded);
      }
    }
  }
  for (Shape sh : {Shape{6144, 4096, 128}, Shape{4096, 14336, 128}}) {
    Int4Weight w = make_weight(rng, sh, s);
    for (int64_t m : {int64_t(1), sh.k == 4096 ? int64_t(8) : int64_t(7)}) {
      for (int round : {0, 1}) {
        RunOpts o;  // the automatic choice, as the backend launches it
        o.preload = 1;
        o.gemv_round = round;
        o.exact_ref = round == 0;
        cuda::Int4LinearParams p{};
        p.m = m;
        p.n = sh.n;
        p.k = sh.k;
        p.group = sh.group;
        EXPECT_EQ(cuda::int4_gemv_auto_kernel(p), cuda::kInt4GemvReg);
        double rounded = 0;
        const double e = run_linear(rng, w, m, false, o, s, &rounded);
        EXPECT_LT(e, 1e-5) << "reg 8B n " << sh.n << " k " << sh.k << " m " << m;
        std::printf("int4 reg 8B n=%lld k=%lld m=%lld round=%d nmse %.3g (vs rounded %.3g)\n",
                    (long long)sh.n, (long long)sh.k, (long long)m, round, e, rounded);
      }
    }
  }
}

TEST(Int4Parity, GemvRegSwiGlu) {
  Stream s;
  std::mt19937 rng(19);
  for (Shape sh : {Shape{2 * 592, 4128, 32}, Shape{2 * 2048, 2944, 128}, Shape{2 * 32, 64, 32},
                   Shape{2 * 48, 768, 256}, Shape{2 * 14336, 4096, 128}}) {
    Int4Weight w = make_weight(rng, sh, s);
    for (size_t ki = 0; ki < std::size(kRegKnobs); ++ki) {
      for (int64_t m : {1, 3, 8}) {
        if (sh.n > 20000 && (ki % 3 != 0 || m == 3)) continue;  // the 8B gate_up: a few
        const RunOpts o = reg_opts(kRegKnobs[ki]);
        ASSERT_TRUE(gemv_fits(o, m, sh.n, sh.k, sh.group, sh.n / 2)) << "knobs " << ki;
        expect_rows(o, m, sh.n, sh.k, sh.group, sh.n / 2);
        const double e = run_swiglu(rng, w, m, m % 2 == 1, o, s);
        EXPECT_LT(e, 1e-5) << "reg swiglu knobs " << ki << " m " << m << " inter " << sh.n / 2
                           << " k " << sh.k;
        if (ki == 0 || e >= 1e-5)
          std::printf("int4 reg+swiglu knobs=%zu m=%lld inter=%lld k=%lld group=%d nmse %.3g\n", ki,
                      (long long)m, (long long)sh.n / 2, (long long)sh.k, sh.group, e);
      }
    }
  }
}

// Which GEMV launch_int4_gemv picks, and the GEMV / GEMM crossover.
TEST(Int4Parity, GemvChoice) {
  auto params = [](int64_t m, int64_t n, int64_t k, int group) {
    cuda::Int4LinearParams p{};
    p.m = m;
    p.n = n;
    p.k = k;
    p.group = group;
    return p;
  };
  EXPECT_TRUE(cuda::int4_gemv_stream_fits(params(1, 6144, 4096, 128)));
  EXPECT_TRUE(cuda::int4_gemv_stream_fits(params(8, 6144, 4096, 128)));
  EXPECT_TRUE(cuda::int4_gemv_stream_fits(params(1, 4096, 14336, 128)));
  EXPECT_TRUE(cuda::int4_gemv_stream_fits(params(6, 4096, 14336, 128)));
  EXPECT_FALSE(cuda::int4_gemv_stream_fits(params(8, 4096, 14336, 128)));  // x: 229 KB
  EXPECT_FALSE(cuda::int4_gemv_stream_fits(params(9, 6144, 4096, 128)));   // one n tile
  EXPECT_FALSE(cuda::int4_gemv_stream_fits(params(1, 6144, 4096, 512)));   // x sums per warp
  // The register GEMV wherever it fits (m <= 8, group <= 256, x within 227 KB), else the mma GEMV.
  for (int64_t m = 1; m <= 8; ++m)
    EXPECT_EQ(cuda::int4_gemv_auto_kernel(params(m, 6144, 4096, 128)), cuda::kInt4GemvReg) << m;
  EXPECT_EQ(cuda::int4_gemv_auto_kernel(params(7, 4096, 14336, 128)), cuda::kInt4GemvReg);
  EXPECT_EQ(cuda::int4_gemv_auto_kernel(params(8, 4096, 14336, 128)), cuda::kInt4GemvMma);
  EXPECT_EQ(cuda::int4_gemv_auto_kernel(params(9, 6144, 4096, 128)), cuda::kInt4GemvMma);
  EXPECT_EQ(cuda::int4_gemv_auto_kernel(params(1, 6144, 4096, 512)), cuda::kInt4GemvMma);
  EXPECT_EQ(cuda::int4_gemv_auto_kernel(params(1, 6144, 4096, 32)), cuda::kInt4GemvReg);
  auto forced = params(1, 6144, 4096, 128);
  forced.gemv_kernel = cuda::kInt4GemvStream;
  EXPECT_EQ(cuda::int4_gemv_auto_kernel(forced), cuda::kInt4GemvStream);
  // x by bulk copy (gemv_x_tma) where its raw rows fit beside the fragments, else loaded as
  // without it (m 8, k 8,192: 128 KB twice); never into the experts modes.
  auto tma = params(1, 6144, 4096, 128);
  tma.gemv_x_tma = 32768;
  EXPECT_TRUE(cuda::int4_gemv_reg_x_tma(tma));
  tma = params(8, 4096, 8192, 128);
  tma.gemv_x_tma = 1 << 20;
  EXPECT_TRUE(cuda::int4_gemv_reg_fits(tma));
  EXPECT_FALSE(cuda::int4_gemv_reg_x_tma(tma));
  tma = params(2, 4096, 8192, 128);
  tma.gemv_x_tma = 32768;
  EXPECT_TRUE(cuda::int4_gemv_reg_x_tma(tma));
  tma.gemv_x_tma = 32767;
  EXPECT_FALSE(cuda::int4_gemv_reg_x_tma(tma));
  EXPECT_TRUE(cuda::int4_use_gemv(1, 6144, 4096));
  EXPECT_TRUE(cuda::int4_use_gemv(8, 28672, 4096));
  EXPECT_FALSE(cuda::int4_use_gemv(16, 6144, 4096));
}

}  // namespace
}  // namespace strata
