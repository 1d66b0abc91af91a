// W4A16 linears (backend/cuda/linear_int4.h) on the Llama-3.1-8B layer shapes, group 128, random
// weights made on the device in the repacked layout:
//   ceilings  device-to-device copy bandwidth (4 GiB, median of 10) and cuBLAS bf16 GEMM 8192³
//   gemv      per shape (gate_up also with the SwiGLU epilogue) and m = 1..32: launch_int4_gemv's
//             automatic choice (the register GEMV for m <= 8 where x fits), the mma and stream
//             GEMVs forced, and the GEMM (the crossover), % of copy bandwidth on packed + scale
//             bytes, each per launch in a CUDA graph of back-to-back launches (as the backend's
//             decode steps run; m = 1 also eager); the register GEMV's knob sweep at m = 1
//             (warps, ring, trigger point, residency depth; preload off; rounded weights) and
//             its trigger points at m = 8 (7 for down: the most that fits); the stream GEMV's
//             defaults and former best knobs; one decode token's GEMVs summed per shape
//             (m = 1..32), and the 128 launched as a model runs them (32 layers with their own
//             weights, interleaved), per variant (kernel and knobs): the number issue 21 asks for
//   scan      where the GEMV's time goes: m = 1, k = 4096, n = 1,024 .. 65,536 (and k = 14,336),
//             the W4A16 GEMV (launch_int4_gemv's choice) and the bf16 GEMV (linear.h) per launch
//             in the same back-to-back graphs, with a least-squares line time = fixed + bytes /
//             rate per kernel: a fixed cost a launch (start, x, epilogue, completion) against a
//             streaming rate short of copy bandwidth
//   token     one decode token's 128 GEMVs at m = 1 as a model runs them (the gemv stage's
//             "token" line), backend knobs and kernel defaults, three rounds: a quick A/B
//   gemm      the GEMM at m = 32 .. 8192 against bf16 cuBLAS on a bf16 weight of the same shape
//             and against dequantize-to-bf16 + cuBLAS (the fallback), each kernel configuration
// Every timing is CUDA events around back-to-back launches over weight copies that together
// exceed the L2 cache (GEMVs: captured as a CUDA graph), median of 10 after warm-up. Each
// kernel's output is checked against dequant + cuBLAS first (NMSE printed): a wrong kernel's
// timings mean nothing.
//
// Usage: strata_bench_int4_linear_bench [--what ceilings,gemv,scan,token,gemm] [--m 32,64,...]
#include <cublas_v2.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/elementwise.h"
#include "backend/cuda/linear.h"
#include "backend/cuda/linear_int4.h"
#include "backend/cuda/tunables.h"
#include "bench_args.h"
#include "bench_timing.h"
#include "core/dtype.h"
#include "support/device_buffer.h"

namespace strata {
namespace {

using bench::Ceilings;
using bench::measure_ceilings;
using bench::time_ms;

using cuda::bf16_bits;

using testing::Dev;  // tests/support/device_buffer.h

void fill(void* p, size_t bytes, uint64_t seed, float scale, cudaStream_t s) {
  cuda::launch_fill_random_bf16(static_cast<bf16_bits*>(p), int64_t(bytes / 2), seed, scale, s);
}

// out [m, n] = x [m, k] · w [n, k]ᵀ, bf16, cuBLAS.
void cublas_linear(cublasHandle_t h, const void* w, const void* x, void* out, int64_t m, int64_t n,
                   int64_t k) {
  const float alpha = 1, beta = 0;
  CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, int(n), int(m), int(k), &alpha, w, CUDA_R_16BF,
                     int(k), x, CUDA_R_16BF, int(k), &beta, out, CUDA_R_16BF, int(n),
                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
}

struct Shape {
  const char* name;
  int64_t n, k;
  bool glu;  // gate_up with the SwiGLU epilogue (GEMV only)
};
constexpr int kGroup = 128;
const Shape kShapes[] = {{"qkv", 6144, 4096, false},
                         {"o_proj", 4096, 4096, false},
                         {"gate_up", 28672, 4096, false},
                         {"gate_up+silu", 28672, 4096, true},
                         {"down", 4096, 14336, false}};

// Copies of one shape's INT4 weight (device layout) that together exceed the L2 cache.
struct Weights {
  int64_t n, k;
  std::vector<std::unique_ptr<Dev>> packed, scale;
  int64_t bytes() const {  // packed + scales of one copy
    return cuda::int4_packed_bytes(n, k) + cuda::int4_scale_bytes(n, k, kGroup);
  }
  int copies() const { return int(packed.size()); }
};

Weights make_weights(int64_t n, int64_t k, cudaStream_t s, uint64_t seed) {
  Weights w;
  w.n = n;
  w.k = k;
  const int copies = int(std::max<int64_t>(2, (int64_t(256) << 20) / w.bytes() + 1));
  for (int i = 0; i < copies; ++i) {
    w.packed.push_back(std::make_unique<Dev>(size_t(cuda::int4_packed_bytes(n, k))));
    w.scale.push_back(std::make_unique<Dev>(size_t(cuda::int4_scale_bytes(n, k, kGroup))));
    fill(w.packed.back()->as<void>(), w.packed.back()->bytes(), seed + 2 * uint64_t(i), 1.0f, s);
    fill(w.scale.back()->as<void>(), w.scale.back()->bytes(), seed + 2 * uint64_t(i) + 1, 0.02f, s);
  }
  return w;
}

cuda::Int4LinearParams linear_params(const Weights& w, int i, const Dev& x, Dev& out, int64_t m) {
  cuda::Int4LinearParams p{};
  p.x = x.as<bf16_bits>();
  p.packed = w.packed[size_t(i)]->as<void>();
  p.scale = w.scale[size_t(i)]->as<bf16_bits>();
  p.out = out.as<bf16_bits>();
  p.m = m;
  p.n = w.n;
  p.k = w.k;
  p.group = kGroup;
  return p;
}

std::vector<uint16_t> download(const Dev& d, size_t count, cudaStream_t s) {
  std::vector<uint16_t> v(count);
  CUDA_CHECK(cudaStreamSynchronize(s));
  CUDA_CHECK(cudaMemcpy(v.data(), d.as<void>(), count * 2, cudaMemcpyDeviceToHost));
  return v;
}
double nmse(const std::vector<uint16_t>& got, const std::vector<uint16_t>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = bf16_to_f32(got[i]), w = bf16_to_f32(want[i]);
    if (!std::isfinite(g)) return INFINITY;
    num += (g - w) * (g - w);
    den += w * w;
  }
  return den > 0 ? num / den : num;
}

// Rows checked against the reference (the first ones: the parity tests cover partial tiles).
constexpr int64_t kCheckRows = 512;

// The reference output of weight copy 0, its first min(m, kCheckRows) rows: dequantize to bf16,
// cuBLAS, (SwiGLU: silu_mul).
std::vector<uint16_t> reference(cublasHandle_t h, const Weights& w, const Dev& x, int64_t m_all,
                                bool glu, cudaStream_t s) {
  const int64_t m = std::min(m_all, kCheckRows);
  Dev wb(size_t(w.n * w.k) * 2), out(size_t(m * w.n) * 2);
  cuda::Int4DequantParams dq{w.packed[0]->as<void>(),
                             w.scale[0]->as<bf16_bits>(),
                             wb.as<bf16_bits>(),
                             w.n,
                             w.k,
                             kGroup,
                             0};
  cuda::launch_int4_dequant_bf16(dq, s);
  cublas_linear(h, wb.as<void>(), x.as<void>(), out.as<void>(), m, w.n, w.k);
  if (!glu) return download(out, size_t(m * w.n), s);
  Dev act(size_t(m * w.n / 2) * 2);
  cuda::SiluMulParams sp{out.as<bf16_bits>(), act.as<bf16_bits>(), m, w.n / 2};
  cuda::launch_silu_mul(sp, cuda::Launch{s});
  return download(act, size_t(m * w.n / 2), s);
}

// GEMV launch knobs (linear_int4.h); 0 = the launcher's default. preload 1 and early 0 are what
// the backend passes (linear_packed.cc; pdl_early is its tunable, off by default).
struct GemvKnobs {
  int kernel = 0, warps = 0, stages = 0, chunk = 0, grid = 0, round = 0, preload = 1, early = 0;
  int unroll = 0, trigger = 0, depth = 0, rows = 0, x_tma = 0;  // register GEMV
};
void apply(const GemvKnobs& k, cuda::Int4LinearParams* p) {
  p->gemv_kernel = k.kernel;
  p->gemv_warps = k.warps;
  p->gemv_stages = k.stages;
  p->gemv_chunk = k.chunk;
  p->gemv_grid = k.grid;
  p->gemv_round = k.round;
  p->preload = k.preload;
  p->pdl_early = k.early;
  p->gemv_unroll = k.unroll;
  p->gemv_trigger = k.trigger;
  p->gemv_depth = k.depth;
  p->gemv_rows = k.rows;
  p->gemv_x_tma = k.x_tma;
}
const char* kernel_name(int kernel) {
  return kernel == cuda::kInt4GemvReg ? "reg" : kernel == cuda::kInt4GemvStream ? "stream" : "mma";
}
std::string knob_str(const GemvKnobs& k) {
  char b[200];
  if (k.kernel == cuda::kInt4GemvStream)
    std::snprintf(b, sizeof b, "warps %2d chunk %d stages %d grid %3d round %d preload %d early %d",
                  k.warps, k.chunk, k.stages, k.grid, k.round, k.preload, k.early);
  else
    std::snprintf(b, sizeof b,
                  "warps %d unroll %2d trigger %d depth %d grid %3d round %d preload %d rows %d",
                  k.warps, k.unroll, k.trigger, k.depth, k.grid, k.round, k.preload, k.rows);
  return b;
}

// Microseconds per call of `enqueue(i)` for i < calls: captured as one CUDA graph and replayed
// (as the backend's decode steps run: no host launch cost between kernels; PDL edges kept), or
// launched eagerly.
template <typename F>
double per_call_us(cudaStream_t s, int calls, bool graph, F&& enqueue) {
  if (!graph)
    return 1e3 *
           time_ms(s, 3, 10,
                   [&] {
                     for (int i = 0; i < calls; ++i) enqueue(i);
                   }) /
           calls;
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < calls; ++i) enqueue(i);
  CUDA_CHECK(cudaStreamEndCapture(s, &g));
  CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
  const double ms = time_ms(s, 3, 10, [&] { CUDA_CHECK(cudaGraphLaunch(ge, s)); });
  CUDA_CHECK(cudaGraphExecDestroy(ge));
  CUDA_CHECK(cudaGraphDestroy(g));
  return ms * 1e3 / calls;
}

struct GemvRow {
  std::string name;
  int64_t m;
  double us, pct;
  std::string note;
};

// One shape's GEMV benchmark state: weight copies, x, out, the reference of copy 0 per m.
struct GemvCase {
  const Shape& sh;
  Weights w;
  Dev x, out;
  double gb;  // packed + scale GB of one copy
  GemvCase(const Shape& shape, cudaStream_t s)
      : sh(shape),
        w(make_weights(shape.n, shape.k, s, 100)),
        x(size_t(32 * shape.k) * 2),
        out(size_t(32 * shape.n) * 2),
        gb(double(w.bytes()) / 1e9) {
    fill(x.as<void>(), x.bytes(), 99, 1.0f, s);
  }
  int64_t out_cols() const { return sh.glu ? sh.n / 2 : sh.n; }
  cuda::Int4LinearParams params(int i, int64_t m, const GemvKnobs& k) {
    cuda::Int4LinearParams p = linear_params(w, i, x, out, m);
    p.glu_inter = sh.glu ? sh.n / 2 : 0;
    apply(k, &p);
    return p;
  }
  bool fits(int64_t m, const GemvKnobs& k) {
    const cuda::Int4LinearParams p = params(0, m, k);
    if (k.kernel == cuda::kInt4GemvStream) return cuda::int4_gemv_stream_fits(p);
    if (k.kernel == cuda::kInt4GemvReg) return cuda::int4_gemv_reg_fits(p);
    return true;
  }
  // NMSE of copy 0's GEMV output against `want`.
  double check(int64_t m, const GemvKnobs& k, const std::vector<uint16_t>& want, cudaStream_t s) {
    cuda::launch_int4_gemv(params(0, m, k), s);
    return nmse(download(out, size_t(m * out_cols()), s), want);
  }
  // Per launch, back to back over the weight copies (a CUDA graph unless `graph` is false).
  double time_us(int64_t m, const GemvKnobs& k, cudaStream_t s, bool graph = true) {
    return per_call_us(s, w.copies(), graph,
                       [&](int i) { cuda::launch_int4_gemv(params(i, m, k), s); });
  }
  double pct(double us, double copy_gbs) const { return 100.0 * gb / (us * 1e-6) / copy_gbs; }
};

// Checks and times each of `cands` (those that fit) at m; prints one line each; returns the
// fastest correct one.
GemvKnobs sweep(GemvCase& gc, int64_t m, const Ceilings& c, cudaStream_t s,
                const std::vector<uint16_t>& want, const std::vector<GemvKnobs>& cands) {
  GemvKnobs best = cands.front();
  double best_us = 1e30;
  for (const GemvKnobs& k : cands) {
    if (!gc.fits(m, k)) continue;
    const double e = gc.check(m, k, want, s);
    const double us = gc.time_us(m, k, s);
    std::printf("%-8s %-12s m=%-2lld %s: %7.2f us %5.1f%% of copy (nmse %.2g)%s\n",
                kernel_name(k.kernel), gc.sh.name, (long long)m, knob_str(k).c_str(), us,
                gc.pct(us, c.copy_gbs), e, e < 1e-4 ? "" : " WRONG");
    if (e < 1e-4 && us < best_us) {
      best_us = us;
      best = k;
    }
  }
  return best;
}

// The register GEMV's knobs: defaults, then warps x ring x trigger x depth (full), the preload
// off and the rounded weights.
std::vector<GemvKnobs> reg_candidates(bool full) {
  std::vector<GemvKnobs> out;
  GemvKnobs d;
  d.kernel = cuda::kInt4GemvReg;
  out.push_back(d);
  if (!full) {
    for (int trigger : {2, 3}) {
      GemvKnobs k = d;
      k.trigger = trigger;
      out.push_back(k);
    }
    return out;
  }
  for (int warps : {4, 8})
    for (int unroll : {8, 16})
      for (int trigger : {1, 2, 3})
        for (int depth : {0, 1, 2}) {
          GemvKnobs k = d;
          k.warps = warps;
          k.unroll = unroll;
          k.trigger = trigger;
          k.depth = depth;
          out.push_back(k);
        }
  // Occupancy: the default grid is one block per SM (8 warps: 2 per scheduler); more blocks
  // per SM where the registers allow (ring 8 needs fewer registers than ring 16).
  for (int warps : {4, 8})
    for (int unroll : {8, 16})
      for (int per_sm : {2, 3, 4}) {
        GemvKnobs k = d;
        k.warps = warps;
        k.unroll = unroll;
        k.grid = per_sm * cuda::num_sms();
        out.push_back(k);
      }
  GemvKnobs k = d;
  k.preload = 0;
  out.push_back(k);
  k = d;
  k.round = 1;
  out.push_back(k);
  return out;
}

// The stream GEMV's knobs: defaults and the best of 2026-12-01 per shape class (8 warps of
// 8-tile stages for k = 4,096; 16 warps of 4-tile stages for down), early trigger on and off.
std::vector<GemvKnobs> stream_candidates() {
  std::vector<GemvKnobs> out;
  GemvKnobs d;
  d.kernel = cuda::kInt4GemvStream;
  out.push_back(d);
  for (int warps : {8, 16})
    for (int early : {0, 1}) {
      GemvKnobs k = d;
      k.warps = warps;
      k.chunk = warps == 8 ? 8 : 4;
      k.stages = 2;
      k.early = early;
      out.push_back(k);
    }
  return out;
}

// One decode token's 128 GEMVs launched as a model runs them: 32 layers of qkv, o_proj,
// gate_up + SwiGLU, down, each layer its own weights (3.6 GB at group 128).
struct TokenWeights {
  static constexpr int kLayers = 32;
  static constexpr int kShapeIdx[4] = {0, 1, 3, 4};  // kShapes: qkv, o_proj, gate_up+silu, down
  std::vector<std::unique_ptr<Dev>> packed, scale;   // [layer][4]
  Dev x{size_t(32 * 14336) * 2}, out{size_t(32 * 28672) * 2};
  double gb = 0;
  explicit TokenWeights(cudaStream_t s) {
    for (int l = 0; l < kLayers; ++l)
      for (int j = 0; j < 4; ++j) {
        const Shape& sh = kShapes[kShapeIdx[j]];
        packed.push_back(std::make_unique<Dev>(size_t(cuda::int4_packed_bytes(sh.n, sh.k))));
        scale.push_back(std::make_unique<Dev>(size_t(cuda::int4_scale_bytes(sh.n, sh.k, kGroup))));
        fill(packed.back()->as<void>(), packed.back()->bytes(), 1000 + uint64_t(8 * l + j), 1.0f,
             s);
        fill(scale.back()->as<void>(), scale.back()->bytes(), 2000 + uint64_t(8 * l + j), 0.02f, s);
        gb += double(packed.back()->bytes() + scale.back()->bytes()) / 1e9;
      }
    fill(x.as<void>(), x.bytes(), 98, 1.0f, s);
  }
  // Median ms of the 128 launches (a CUDA graph, or eager); knobs[i] for kShapes[i].
  double time_ms_token(cudaStream_t s, int64_t m, const GemvKnobs* knobs, bool graph) {
    return 1e-3 * kLayers * 4 * per_call_us(s, kLayers * 4, graph, [&](int i) {
             const int l = i / 4, j = i % 4;
             const Shape& sh = kShapes[kShapeIdx[j]];
             cuda::Int4LinearParams p{};
             p.x = x.as<bf16_bits>();
             p.packed = packed[size_t(4 * l + j)]->as<void>();
             p.scale = scale[size_t(4 * l + j)]->as<bf16_bits>();
             p.out = out.as<bf16_bits>();
             p.m = m;
             p.n = sh.n;
             p.k = sh.k;
             p.group = kGroup;
             p.glu_inter = sh.glu ? sh.n / 2 : 0;
             apply(knobs[kShapeIdx[j]], &p);
             cuda::launch_int4_gemv(p, s);
           });
  }
};

void bench_gemv(const Ceilings& c, cudaStream_t s, cublasHandle_t h, std::vector<GemvRow>* rows) {
  const int64_t ms[] = {1, 2, 3, 4, 6, 8, 12, 16, 24, 32};
  constexpr int kM = int(std::size(ms));
  double token_us[kM] = {}, token_gb = 0;
  GemvKnobs best_reg[5], best_stream[5];
  std::printf(
      "gemv     W4A16 group %d: us per launch (CUDA graph of back-to-back launches over weight "
      "copies), %% of copy bandwidth on packed + scale bytes; auto = launch_int4_gemv's choice "
      "(reg: the register GEMV, m <= 8 where x fits), mma / stream = those GEMVs forced, GEMM = "
      "launch_int4_gemm\n",
      kGroup);
  for (int si = 0; si < 5; ++si) {
    const Shape& sh = kShapes[si];
    GemvCase gc(sh, s);
    std::vector<uint16_t> want1;
    for (int mi = 0; mi < kM; ++mi) {
      const int64_t m = ms[mi];
      const auto want = reference(h, gc.w, gc.x, m, sh.glu, s);
      if (m == 1) want1 = want;
      const GemvKnobs auto_k;
      const int kernel = cuda::int4_gemv_auto_kernel(gc.params(0, m, auto_k));
      const double e = gc.check(m, auto_k, want, s);
      const double t = gc.time_us(m, auto_k, s);
      GemvKnobs mma_k, stream_k;
      mma_k.kernel = cuda::kInt4GemvMma;
      stream_k.kernel = cuda::kInt4GemvStream;
      const double e_mma = gc.check(m, mma_k, want, s);
      const double t_mma = gc.time_us(m, mma_k, s);
      double e_st = 0, t_st = 0;  // the stream GEMV where it fits
      if (gc.fits(m, stream_k)) {
        e_st = gc.check(m, stream_k, want, s);
        t_st = gc.time_us(m, stream_k, s);
      }
      double t_gemm = 0;  // the GEMM on the same rows (plain shapes): where the GEMVs stop paying
      if (!sh.glu)
        t_gemm = per_call_us(s, gc.w.copies(), true, [&](int i) {
          cuda::launch_int4_gemm(linear_params(gc.w, i, gc.x, gc.out, m), s);
        });
      const double fastest =
          std::min({t, t_mma, t_st > 0 ? t_st : 1e30, t_gemm > 0 ? t_gemm : 1e30});
      std::printf(
          "gemv     %-12s %6lld x %5lld m=%-2lld: auto (%s) %7.2f us %5.1f%% (nmse %.2g)%s | mma "
          "%7.2f us %5.1f%% (nmse %.2g)%s | stream %7.2f us (nmse %.2g)%s | GEMM %7.2f us | "
          "fastest %s\n",
          sh.name, (long long)sh.n, (long long)sh.k, (long long)m, kernel_name(kernel), t,
          gc.pct(t, c.copy_gbs), e, e < 1e-4 ? "" : " WRONG", t_mma, gc.pct(t_mma, c.copy_gbs),
          e_mma, e_mma < 1e-4 ? "" : " WRONG", t_st, e_st, e_st < 1e-4 ? "" : " WRONG", t_gemm,
          fastest == t       ? "auto"
          : fastest == t_mma ? "mma"
          : fastest == t_st  ? "stream"
                             : "GEMM");
      if (std::strcmp(sh.name, "gate_up") != 0) token_us[mi] += 32 * t;
      rows->push_back({sh.name, m, t, gc.pct(t, c.copy_gbs), kernel_name(kernel)});
      if (m == 1) {  // eager launches, for comparison with the graph
        const double te = gc.time_us(m, auto_k, s, false);
        std::printf("gemv     %-12s m=1 auto eager (host launches): %7.2f us %5.1f%%\n", sh.name,
                    te, gc.pct(te, c.copy_gbs));
      }
    }
    if (std::strcmp(sh.name, "gate_up") != 0) token_gb += 32 * gc.gb;
    // The register GEMV's knobs at m = 1 (full sweep) and at the largest m <= 8 that fits.
    best_reg[si] = sweep(gc, 1, c, s, want1, reg_candidates(true));
    const double tb = gc.time_us(1, best_reg[si], s);
    std::printf("reg      %-12s m=1 best: %s: %.2f us %.1f%% of copy\n", sh.name,
                knob_str(best_reg[si]).c_str(), tb, gc.pct(tb, c.copy_gbs));
    rows->push_back(
        {sh.name, 1, tb, gc.pct(tb, c.copy_gbs), "reg best: " + knob_str(best_reg[si])});
    const int64_t m8 = sh.k > 4096 ? 7 : 8;
    const auto want8 = reference(h, gc.w, gc.x, m8, sh.glu, s);
    sweep(gc, m8, c, s, want8, reg_candidates(false));
    best_stream[si] = sweep(gc, 1, c, s, want1, stream_candidates());
  }
  for (int mi = 0; mi < kM; ++mi) {
    const double gbs = token_gb / (token_us[mi] * 1e-6);
    std::printf(
        "gemv     one decode token's W4A16 GEMVs (sum of 32 x qkv, o_proj, gate_up+silu, down "
        "timed per shape), m=%lld: %.3f ms = %.0f GB/s = %.1f%% of copy\n",
        (long long)ms[mi], token_us[mi] * 1e-3, gbs, 100.0 * gbs / c.copy_gbs);
    if (ms[mi] <= 8)
      rows->push_back({"token sum", ms[mi], token_us[mi], 100.0 * gbs / c.copy_gbs, ""});
  }
  // The token as a model runs it (each layer's own weights, the shapes interleaved), per
  // variant: the same knobs on every shape, or the sweep's best per shape.
  struct Variant {
    std::string name;
    GemvKnobs knobs[5];
    bool graph = true;
  };
  auto uniform = [](const char* name, GemvKnobs k, bool graph = true) {
    Variant v;
    v.name = name;
    for (GemvKnobs& ki : v.knobs) ki = k;
    v.graph = graph;
    return v;
  };
  GemvKnobs reg;
  reg.kernel = cuda::kInt4GemvReg;
  std::vector<Variant> variants;
  variants.push_back(uniform("auto (defaults)", GemvKnobs{}));
  variants.push_back(uniform("auto, eager launches", GemvKnobs{}, false));
  for (int trigger : {2, 3}) {
    GemvKnobs k = reg;
    k.trigger = trigger;
    variants.push_back(uniform(trigger == 2 ? "reg trigger after wait" : "reg trigger late", k));
  }
  for (int depth : {1, 2}) {
    GemvKnobs k = reg;
    k.depth = depth;
    variants.push_back(uniform(depth == 1 ? "reg depth 1" : "reg depth 2 (smem padded)", k));
  }
  {
    GemvKnobs k = reg;
    k.unroll = 8;
    variants.push_back(uniform("reg ring 8", k));
    k = reg;
    k.warps = 4;
    variants.push_back(uniform("reg 4 warps", k));
    k = reg;
    k.unroll = 8;
    k.grid = 2 * cuda::num_sms();
    variants.push_back(uniform("reg ring 8, 2 blocks per SM", k));
    k.rows = 4;  // four row tiles a k tile (linear_int4.h gemv_rows)
    variants.push_back(uniform("reg ring 8, 2 blocks per SM, rows 4", k));
    k.round = 1;
    variants.push_back(uniform("reg ring 8, 2 blocks per SM, rows 4, rounded", k));
    k.rows = 0;
    variants.push_back(uniform("reg ring 8, 2 blocks per SM, rounded", k));
    k.round = 0;
    k.warps = 4;
    k.grid = 4 * cuda::num_sms();
    variants.push_back(uniform("reg ring 8, 4 warps, 4 blocks per SM", k));
    k = reg;
    k.preload = 0;
    variants.push_back(uniform("reg preload off", k));
    k = reg;
    k.round = 1;
    variants.push_back(uniform("reg rounded weights", k));
  }
  {
    Variant v;
    v.name = "reg best per shape";
    for (int i = 0; i < 5; ++i) v.knobs[i] = best_reg[i];
    variants.push_back(v);
    GemvKnobs k;
    k.kernel = cuda::kInt4GemvMma;
    variants.push_back(uniform("mma", k));
    k.kernel = cuda::kInt4GemvStream;
    variants.push_back(uniform("stream defaults", k));
    v.name = "stream best per shape";
    for (int i = 0; i < 5; ++i) v.knobs[i] = best_stream[i];
    variants.push_back(v);
  }
  TokenWeights tw(s);
  for (const Variant& v : variants) {
    for (int64_t m : {1, 4, 8}) {
      if (m > 1 && v.name != "auto (defaults)") continue;
      const double ms_tok = tw.time_ms_token(s, m, v.knobs, v.graph);
      const double pct = 100.0 * tw.gb / (ms_tok * 1e-3) / c.copy_gbs;
      std::printf(
          "token    one decode token's 128 W4A16 GEMVs as a model runs them (32 layers, own "
          "weights, %.2f GB), %s, m=%lld: %.3f ms = %.1f%% of copy\n",
          tw.gb, v.name.c_str(), (long long)m, ms_tok, pct);
      rows->push_back({"token " + v.name, m, ms_tok * 1e3, pct, ""});
    }
  }
}

// --what token (see the file comment): one decode token's 128 GEMVs at m = 1 as a model runs them,
// with the backend's knobs (ring 8, two blocks an SM, x by one bulk copy up to 32 KB:
// CudaTunables), those with x loaded by every thread (gemv_x_tma 0) or by bulk copy up to 8 KB
// only (the shapes of k 4,096, not down's), and the kernel's defaults, three rounds alternating.
void bench_token(const Ceilings& c, cudaStream_t s) {
  const cuda::CudaTunables t;
  GemvKnobs backend;
  backend.kernel = cuda::kInt4GemvReg;
  backend.unroll = t.int4_gemv_ring;
  backend.grid = t.int4_gemv_blocks_per_sm * cuda::num_sms();
  backend.x_tma = t.int4_gemv_x_tma;
  GemvKnobs loads = backend, tma8 = backend;
  loads.x_tma = 0;
  tma8.x_tma = 8192;
  const GemvKnobs backend_k[5] = {backend, backend, backend, backend, backend}, auto_k[5] = {};
  const GemvKnobs loads_k[5] = {loads, loads, loads, loads, loads};
  const GemvKnobs tma8_k[5] = {tma8, tma8, tma8, tma8, tma8};
  TokenWeights tw(s);
  for (int round = 0; round < 3; ++round)
    for (const auto& [name, knobs] : {std::pair{"backend knobs", backend_k},
                                      {"x loaded by the threads", loads_k},
                                      {"x by TMA up to 8 KB", tma8_k},
                                      {"kernel defaults", auto_k}}) {
      const double ms_tok = tw.time_ms_token(s, 1, knobs, true);
      std::printf(
          "token    one decode token's 128 W4A16 GEMVs (%.2f GB), %s, round %d: %.3f ms = "
          "%.1f%% of copy\n",
          tw.gb, name, round, ms_tok, 100.0 * tw.gb / (ms_tok * 1e-3) / c.copy_gbs);
    }
}

// The scan (see the file comment): one line per shape and kernel, then each kernel's fit.
void bench_scan(const Ceilings& c, cudaStream_t s) {
  struct Point {
    double mb, us;
  };
  std::vector<Point> int4_pts, bf16_pts;
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {1024, 4096},  {2048, 4096},  {4096, 4096},  {8192, 4096},
      {16384, 4096}, {32768, 4096}, {65536, 4096}, {4096, 14336}};
  Dev x(size_t(4096 * 4) * 2 * 4), out(size_t(65536) * 2 * 8);
  fill(x.as<void>(), x.bytes(), 7, 1.0f, s);
  for (auto [n, k] : shapes) {
    {  // W4A16 with the backend's knobs (linear_packed.cc)
      Weights w = make_weights(n, k, s, 300);
      const cuda::CudaTunables t;
      const double us = per_call_us(s, w.copies(), true, [&](int i) {
        cuda::Int4LinearParams p = linear_params(w, i, x, out, 1);
        p.preload = 1;
        p.pdl_early = t.pdl_early;
        p.gemv_depth = t.int4_gemv_depth;
        p.gemv_grid = t.int4_gemv_blocks_per_sm * cuda::num_sms();
        p.gemv_unroll = t.int4_gemv_ring;
        cuda::launch_int4_gemv(p, s);
      });
      const double mb = double(w.bytes()) / 1e6;
      int4_pts.push_back({mb, us});
      std::printf("scan     w4a16 n %6lld k %5lld: %8.2f MB %8.2f us = %6.1f%% of copy\n",
                  (long long)n, (long long)k, mb, us,
                  100.0 * mb * 1e6 / (us * 1e-6) / 1e9 / c.copy_gbs);
    }
    {  // bf16, the GEMV's default knobs (CudaTunables)
      const cuda::CudaTunables t;
      const int64_t bytes = n * k * 2;
      const int copies = int(std::max<int64_t>(2, (int64_t(256) << 20) / bytes + 1));
      std::vector<std::unique_ptr<Dev>> ws;
      for (int i = 0; i < copies; ++i) {
        ws.push_back(std::make_unique<Dev>(size_t(bytes)));
        fill(ws.back()->as<void>(), size_t(bytes), 400 + uint64_t(i), 0.02f, s);
      }
      const double us = per_call_us(s, copies, true, [&](int i) {
        cuda::GemvParams p{};
        p.x = x.as<bf16_bits>();
        p.w = ws[size_t(i)]->as<bf16_bits>();
        p.out = out.as<bf16_bits>();
        p.m = 1;
        p.n = n;
        p.k = k;
        p.block_warps = t.gemv_block_warps;
        p.max_ksplit = t.gemv_max_ksplit;
        p.prefetch_elems = t.gemv_prefetch_elems;
        p.pdl_early = t.pdl_early;
        cuda::launch_gemv(p, cuda::Launch{s});
      });
      const double mb = double(bytes) / 1e6;
      bf16_pts.push_back({mb, us});
      std::printf("scan     bf16  n %6lld k %5lld: %8.2f MB %8.2f us = %6.1f%% of copy\n",
                  (long long)n, (long long)k, mb, us,
                  100.0 * mb * 1e6 / (us * 1e-6) / 1e9 / c.copy_gbs);
    }
  }
  auto fit = [&](const char* name, const std::vector<Point>& pts) {
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    for (const Point& q : pts) {
      sx += q.mb;
      sy += q.us;
      sxx += q.mb * q.mb;
      sxy += q.mb * q.us;
    }
    const double nn = double(pts.size()), slope = (nn * sxy - sx * sy) / (nn * sxx - sx * sx);
    const double fixed = (sy - slope * sx) / nn, gbs = 1e3 / slope;  // MB / us = GB/s · 1e-3
    double worst = 0;
    for (const Point& q : pts) worst = std::max(worst, std::fabs(q.us - fixed - slope * q.mb));
    std::printf(
        "scan     %-5s fit: %.2f us a launch + bytes at %.0f GB/s = %.1f%% of copy "
        "(largest residual %.2f us)\n",
        name, fixed, gbs, 100.0 * gbs / c.copy_gbs, worst);
  };
  fit("w4a16", int4_pts);
  fit("bf16", bf16_pts);
}

struct GemmRow {
  const char* name;
  int64_t m;
  double int4_us, best_us, bf16_us, deq_us;
  int best_cfg;
};

void bench_gemm(const Ceilings& c, cudaStream_t s, cublasHandle_t h, const std::vector<int>& ms,
                std::vector<GemmRow>* rows) {
  struct Cfg {
    int tokens, ksplit;
  };
  const Cfg cfgs[] = {{0, 0}, {64, 1}, {64, 2}, {128, 1}, {128, 2}};
  std::printf(
      "gemm     W4A16 GEMM vs bf16 cuBLAS vs dequant+cuBLAS, us (TFLOP/s); int4 configs: auto, "
      "64x1, 64x2, 128x1, 128x2 (tokens x k split)\n");
  for (const Shape& sh : kShapes) {
    if (sh.glu) continue;
    Weights w = make_weights(sh.n, sh.k, s, 300);
    const int64_t bf16_bytes = sh.n * sh.k * 2;
    const int bf16_copies = int(std::max<int64_t>(2, (int64_t(256) << 20) / bf16_bytes + 1));
    std::vector<std::unique_ptr<Dev>> wb;
    for (int i = 0; i < bf16_copies; ++i) {
      wb.push_back(std::make_unique<Dev>(size_t(bf16_bytes)));
      fill(wb.back()->as<void>(), size_t(bf16_bytes), 500 + uint64_t(i), 0.02f, s);
    }
    Dev scratch{size_t(bf16_bytes)};
    for (int m : ms) {
      Dev x(size_t(int64_t(m) * sh.k) * 2), out(size_t(int64_t(m) * sh.n) * 2);
      fill(x.as<void>(), x.bytes(), 77, 1.0f, s);
      const double tflop = 2.0 * m * double(sh.n) * double(sh.k) / 1e12;
      const auto want = reference(h, w, x, m, false, s);
      double t[5];
      char line[1024];
      int len =
          std::snprintf(line, sizeof line, "gemm     %-8s %6lld x %5lld m=%-5d int4:", sh.name,
                        (long long)sh.n, (long long)sh.k, m);
      for (int ci = 0; ci < 5; ++ci) {
        auto launch = [&](int i) {
          cuda::Int4LinearParams p = linear_params(w, i, x, out, m);
          p.gemm_tokens = cfgs[ci].tokens;
          p.gemm_ksplit = cfgs[ci].ksplit;
          cuda::launch_int4_gemm(p, s);
        };
        launch(0);
        const double e =
            nmse(download(out, size_t(std::min<int64_t>(m, kCheckRows) * sh.n), s), want);
        t[ci] = time_ms(s, 2, 10,
                        [&] {
                          for (int i = 0; i < w.copies(); ++i) launch(i);
                        }) /
                w.copies();
        len += std::snprintf(line + len, sizeof line - size_t(len), " %.1f (%.0f%s)", t[ci] * 1e3,
                             tflop / (t[ci] * 1e-3), e < 1e-4 ? "" : " WRONG");
      }
      if (m <= cuda::kInt4GemvMaxRows) {  // the GEMV on the same rows
        const double tg = time_ms(s, 2, 10,
                                  [&] {
                                    for (int i = 0; i < w.copies(); ++i)
                                      cuda::launch_int4_gemv(linear_params(w, i, x, out, m), s);
                                  }) /
                          w.copies();
        len += std::snprintf(line + len, sizeof line - size_t(len), " | gemv %.1f", tg * 1e3);
      }
      const double bf16 =
          time_ms(s, 2, 10,
                  [&] {
                    for (auto& wi : wb)
                      cublas_linear(h, wi->as<void>(), x.as<void>(), out.as<void>(), m, sh.n, sh.k);
                  }) /
          bf16_copies;
      const double deq = time_ms(s, 2, 10,
                                 [&] {
                                   for (int i = 0; i < w.copies(); ++i) {
                                     cuda::Int4DequantParams dq{w.packed[size_t(i)]->as<void>(),
                                                                w.scale[size_t(i)]->as<bf16_bits>(),
                                                                scratch.as<bf16_bits>(),
                                                                sh.n,
                                                                sh.k,
                                                                kGroup,
                                                                0};
                                     cuda::launch_int4_dequant_bf16(dq, s);
                                     cublas_linear(h, scratch.as<void>(), x.as<void>(),
                                                   out.as<void>(), m, sh.n, sh.k);
                                   }
                                 }) /
                         w.copies();
      int best = 0;
      for (int ci = 1; ci < 5; ++ci)
        if (t[ci] < t[best]) best = ci;
      std::printf("%s | bf16 cuBLAS %.1f (%.0f) | dequant+cuBLAS %.1f (%.0f)\n", line, bf16 * 1e3,
                  tflop / (bf16 * 1e-3), deq * 1e3, tflop / (deq * 1e-3));
      rows->push_back({sh.name, m, t[0] * 1e3, t[best] * 1e3, bf16 * 1e3, deq * 1e3, best});
    }
  }
  (void)c;
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) {
  using namespace strata;
  std::string what = "ceilings,gemv,gemm";
  std::vector<int> ms = {32, 64, 128, 256, 512, 2048, 8192};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--what")
      what = argv[i + 1];
    else if (a == "--m")
      ms = parse_int_list(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: %s [--what ceilings,gemv,scan,token,gemm] [--m 32,64,...]\n",
                   argv[0]);
      return 2;
    }
  }
  cudaStream_t s;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cublasHandle_t h;
  CHECK(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS);
  CHECK(cublasSetStream(h, s) == CUBLAS_STATUS_SUCCESS);
  cuda::init_int4_linear_kernels();
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device   %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  const Ceilings c = measure_ceilings(s);
  std::vector<GemvRow> gemv_rows;
  if (what.find("gemv") != std::string::npos) bench_gemv(c, s, h, &gemv_rows);
  if (what.find("scan") != std::string::npos) bench_scan(c, s);
  if (what.find("token") != std::string::npos) bench_token(c, s);
  std::vector<GemmRow> rows;
  if (what.find("gemm") != std::string::npos) bench_gemm(c, s, h, ms, &rows);
  std::printf("\nsummary  copy %.0f GB/s, cuBLAS bf16 %.0f TFLOP/s\n", c.copy_gbs, c.gemm_tflops);
  if (!gemv_rows.empty()) {
    std::printf(
        "summary  GEMV, us and %% of copy bandwidth on packed + scale bytes (token: one decode "
        "token's 128 W4A16 GEMVs):\n");
    for (const GemvRow& r : gemv_rows)
      if (r.m == 1 || r.m == 8 || r.name.rfind("token", 0) == 0)
        std::printf("summary  %-24s m=%-2lld %9.2f us %6.1f%%  %s\n", r.name.c_str(),
                    (long long)r.m, r.us, r.pct, r.note.c_str());
  }
  if (!rows.empty()) {
    static const char* kCfg[] = {"auto", "64x1", "64x2", "128x1", "128x2"};
    std::printf(
        "summary  GEMM, us: int4 auto | int4 best (config) | bf16 cuBLAS | dequant+cuBLAS | "
        "best vs dequant+cuBLAS\n");
    for (const GemmRow& r : rows)
      std::printf("summary  %-8s m=%-5lld %9.1f | %9.1f (%-5s) | %9.1f | %9.1f | %.2fx\n", r.name,
                  (long long)r.m, r.int4_us, r.best_us, kCfg[r.best_cfg], r.bf16_us, r.deq_us,
                  r.deq_us / r.best_us);
  }
  cublasDestroy(h);
  cudaStreamDestroy(s);
  return 0;
}
