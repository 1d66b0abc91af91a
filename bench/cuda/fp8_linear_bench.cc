// FP8-block linears (src/backend/cuda/linear_fp8.h) on DeepSeek-V3 shapes, against ceilings
// measured in the same run:
//   ceilings  device-to-device copy bandwidth (read + write) and the cuBLAS bf16 GEMM rate
//   gemv      the W8A16 decode GEMV at m = 1, 2, 4, 8, 16: time, GB/s counted on weight + scale
//             bytes, % of copy bandwidth; at m = 1 every k split; the prefill path (act_quant +
//             GEMM) at m = 4, 8, 16 beside it (the crossover the dispatch needs)
//   gemm      the prefill path at M = 512, 2048, 8192: act_quant alone, the cuBLASLt block-scaled
//             GEMM alone, both, and cuBLAS bf16 on the same (dequantized) weights; the FP8
//             output's NMSE against the bf16 one (W8A8 quantization error, ~6e-4 expected)
// Weights are random finite e4m3 codes with realistic block scales, rotated over copies that
// together exceed the L2 cache; CUDA events, warm-up, median of --reps. A short table ends it.
//
// Usage: strata_bench_fp8_linear_bench [--what ceilings,gemv,gemm] [--reps N]
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/elementwise.h"
#include "backend/cuda/launch.h"
#include "backend/cuda/linear_fp8.h"
#include "bench_timing.h"

namespace strata {
namespace {

using bench::Ceilings;
using bench::measure_ceilings;

using cuda::bf16_bits;

int g_reps = 15;

// Median of g_reps timed runs after `warmup` (bench_timing.h).
template <typename F>
double time_ms(cudaStream_t stream, int warmup, F&& fn) {
  return bench::time_ms(stream, warmup, g_reps, fn);
}

template <typename T>
T* dev_alloc(int64_t n) {
  T* p = nullptr;
  CUDA_CHECK(cudaMalloc(&p, size_t(std::max<int64_t>(n, 1)) * sizeof(T)));
  return p;
}

// Random finite e4m3 codes (no NaN) and block scales of a realistic magnitude, made on the host.
struct Fp8Set {
  int64_t n = 0, k = 0, ld = 0;
  std::vector<uint8_t*> w;
  std::vector<float*> scale;
  cuda::Fp8Weight view(size_t i) const { return cuda::Fp8Weight{w[i], scale[i], n, k, ld, 0, 0}; }
  int64_t bytes() const { return n * k + cuda::fp8_scale_cols(n) * ld * 4; }
  void release() {
    for (auto* p : w) cudaFree(p);
    for (auto* p : scale) cudaFree(p);
    w.clear();
    scale.clear();
  }
};

Fp8Set make_fp8_set(int64_t n, int64_t k, int copies) {
  Fp8Set s;
  s.n = n;
  s.k = k;
  s.ld = cuda::fp8_gemm_scale_ld(k);  // usable by the GEMV and the GEMM alike
  std::vector<uint8_t> hw(size_t(n * k));
  uint64_t st = 0x9e3779b97f4a7c15ull ^ uint64_t(n * 131 + k);
  for (auto& b : hw) {
    st ^= st << 13;
    st ^= st >> 7;
    st ^= st << 17;
    uint8_t v = uint8_t(st >> 24);
    if ((v & 0x7f) == 0x7f) v &= 0xfe;  // NaN codes -> ±448
    b = v;
  }
  std::vector<float> hs(size_t(cuda::fp8_scale_cols(n) * s.ld), 0.0f);
  for (size_t i = 0; i < hs.size(); ++i) hs[i] = 1.5e-4f * (1.0f + float(i % 7) * 0.1f);
  for (int c = 0; c < copies; ++c) {
    s.w.push_back(dev_alloc<uint8_t>(n * k));
    s.scale.push_back(dev_alloc<float>(int64_t(hs.size())));
    CUDA_CHECK(cudaMemcpy(s.w.back(), hw.data(), hw.size(), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(s.scale.back(), hs.data(), hs.size() * 4, cudaMemcpyHostToDevice));
  }
  return s;
}

// Copies of a weight of `bytes` that together exceed the L2 cache (and at least 2).
int copies_for(int64_t bytes) {
  return int(std::max<int64_t>(2, (int64_t(256) << 20) / bytes + 1));
}

struct Summary {
  std::vector<std::string> lines;
};

// ---- the prefill path on one shape and m (shared by the gemv and gemm stages) ----
struct Prefill {
  cuda::Fp8GemmPlanner* planner;
  cudaStream_t stream;
  uint8_t* xq;
  float* xs;
};

// act_quant + GEMM over the weight copies (m % 4 == 0); returns ms per call, or -1 (no plan).
double time_fp8_linear(Prefill& pf, const Fp8Set& s, const bf16_bits* x, bf16_bits* out, int64_t m,
                       std::string* plan_text) {
  std::string why;
  cuda::Fp8GemmPlan* plan = pf.planner->try_plan(m, s.n, s.k, &why);
  if (!plan) {
    std::printf("  no plan: %s\n", why.c_str());
    return -1;
  }
  if (plan_text) *plan_text = cuda::describe(*plan);
  return time_ms(pf.stream, 3,
                 [&] {
                   for (size_t i = 0; i < s.w.size(); ++i) {
                     cuda::Fp8LinearParams p{};
                     p.plan = plan;
                     p.x = x;
                     p.w = s.view(i);
                     p.out = out;
                     p.xq = pf.xq;
                     p.x_scale = pf.xs;
                     p.m = m;
                     cuda::launch_fp8_linear(p, pf.stream);
                   }
                 }) /
         double(s.w.size());
}

void bench_gemv(const Ceilings& c, Prefill& pf, Summary& sum) {
  struct Shape {
    const char* name;
    int64_t n, k;
    bool glu;
  };
  const Shape shapes[] = {
      {"mlp gate/up 7168->18432", 18432, 7168, false},
      {"mlp down 18432->7168", 7168, 18432, false},
      {"q_a 7168->1536", 1536, 7168, false},
      {"kv_a 7168->576", 576, 7168, false},
      {"q_b 1536->24576", 24576, 1536, false},
      {"mlp gate_up+silu [36864,7168]", 36864, 7168, true},
      {"expert gate_up+silu [4096,7168]", 4096, 7168, true},
  };
  const int64_t kMaxM = 16;
  auto* x = dev_alloc<bf16_bits>(kMaxM * 18432);
  auto* out = dev_alloc<bf16_bits>(kMaxM * 36864);
  cuda::launch_fill_random_bf16(x, kMaxM * 18432, 5, 1.0f, pf.stream);
  for (const Shape& sh : shapes) {
    const int64_t wbytes = sh.n * sh.k;
    Fp8Set s = make_fp8_set(sh.n, sh.k, copies_for(wbytes));
    const double gb = double(s.bytes()) / 1e9;
    auto run = [&](int m, int ks) {
      return time_ms(pf.stream, 2,
                     [&] {
                       for (size_t i = 0; i < s.w.size(); ++i) {
                         cuda::Fp8GemvParams p{};
                         p.x = x;
                         p.w = s.view(i);
                         p.out = out;
                         p.glu_inter = sh.glu ? sh.n / 2 : 0;
                         p.m = m;
                         p.batches = 1;
                         p.ksplit = ks;
                         cuda::launch_fp8_gemv(p, pf.stream);
                       }
                     }) /
             double(s.w.size());
    };
    std::printf("gemv     %s [%lld, %lld] (%.1f MB weights+scales, %zu copies):\n", sh.name,
                (long long)sh.n, (long long)sh.k, gb * 1e3, s.w.size());
    // m = 1: every k split (0 = the automatic choice).
    double best = 1e30;
    int best_ks = 0;
    for (int ks : {0, 1, 2, 4, 8}) {
      if (sh.glu && ks == 8) continue;
      const double ms = run(1, ks);
      const int used = ks ? ks : cuda::fp8_gemv_auto_ksplit(sh.n, sh.k, sh.glu);
      std::printf("gemv       m=1 ksplit %d%s: %7.1f us  %5.0f GB/s  %5.1f%% of copy\n", used,
                  ks ? "" : " (auto)", ms * 1e3, gb / (ms * 1e-3),
                  100.0 * gb / (ms * 1e-3) / c.copy_gbs);
      if (ms < best) best = ms, best_ks = used;
    }
    const double auto1 = run(1, 0);
    sum.lines.push_back(
        fmt::format("gemv m=1  {:<34} {:7.1f} us {:5.1f}% of copy (best ksplit {}: {:.1f}%)",
                    sh.name, auto1 * 1e3, 100.0 * gb / (auto1 * 1e-3) / c.copy_gbs, best_ks,
                    100.0 * gb / (best * 1e-3) / c.copy_gbs));
    for (int m : {2, 4, 8, 16}) {
      const double ms = run(m, 0);
      std::printf("gemv       m=%-2d        : %7.1f us  %5.0f GB/s  %5.1f%% of copy", m, ms * 1e3,
                  gb / (ms * 1e-3), 100.0 * gb / (ms * 1e-3) / c.copy_gbs);
      std::string line = fmt::format("gemv m={:<2} {:<34} {:7.1f} us {:5.1f}% of copy", m, sh.name,
                                     ms * 1e3, 100.0 * gb / (ms * 1e-3) / c.copy_gbs);
      if (!sh.glu && m >= 4) {  // the prefill path on the same rows (GLU: gemm + silu, skipped)
        const double lms = time_fp8_linear(pf, s, x, out, m, nullptr);
        std::printf("   | act_quant+gemm: %7.1f us", lms * 1e3);
        line += fmt::format(" | act_quant+gemm {:7.1f} us", lms * 1e3);
      }
      std::printf("\n");
      sum.lines.push_back(line);
    }
    s.release();
  }
  cudaFree(x);
  cudaFree(out);
}

double nmse_bf16(const bf16_bits* got_dev, const bf16_bits* ref_dev, int64_t n) {
  std::vector<uint16_t> g(static_cast<size_t>(n)), r(static_cast<size_t>(n));
  CUDA_CHECK(cudaMemcpy(g.data(), got_dev, size_t(n) * 2, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(r.data(), ref_dev, size_t(n) * 2, cudaMemcpyDeviceToHost));
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    float a, b;
    const uint32_t ga = uint32_t(g[size_t(i)]) << 16, rb = uint32_t(r[size_t(i)]) << 16;
    std::memcpy(&a, &ga, 4);
    std::memcpy(&b, &rb, 4);
    if (!std::isfinite(a)) return INFINITY;
    num += double(a - b) * (a - b);
    den += double(b) * b;
  }
  return den > 0 ? num / den : num;
}

void bench_gemm(const Ceilings& c, Prefill& pf, cublasHandle_t h, Summary& sum) {
  struct Shape {
    const char* name;
    int64_t n, k;
  };
  const Shape shapes[] = {
      {"7168->18432", 18432, 7168}, {"18432->7168", 7168, 18432}, {"7168->1536", 1536, 7168}};
  const int64_t kMaxM = 8192;
  auto* x = dev_alloc<bf16_bits>(kMaxM * 18432);
  auto* out = dev_alloc<bf16_bits>(kMaxM * 18432);
  auto* ref = dev_alloc<bf16_bits>(kMaxM * 18432);
  cuda::launch_fill_random_bf16(x, kMaxM * 18432, 6, 1.0f, pf.stream);
  for (const Shape& sh : shapes) {
    Fp8Set s = make_fp8_set(sh.n, sh.k, 2);
    std::vector<bf16_bits*> wb;  // the same weights dequantized: what a bf16 checkpoint would hold
    for (size_t i = 0; i < s.w.size(); ++i) {
      wb.push_back(dev_alloc<bf16_bits>(sh.n * sh.k));
      cuda::Fp8DequantParams d{};
      d.w = s.view(i);
      d.out = wb.back();
      cuda::launch_fp8_dequant(d, pf.stream);
    }
    CUDA_CHECK(cudaStreamSynchronize(pf.stream));
    for (int64_t m : {int64_t(512), int64_t(2048), int64_t(8192)}) {
      const double flop = 2.0 * double(m) * double(sh.n) * double(sh.k);
      std::string plan_text;
      const double lin = time_fp8_linear(pf, s, x, out, m, &plan_text);
      if (lin < 0) continue;
      cuda::Fp8GemmPlan* plan = pf.planner->plan(m, sh.n, sh.k);
      const double quant = time_ms(pf.stream, 3, [&] {
        cuda::Fp8ActQuantParams q{};
        q.x = x;
        q.q = pf.xq;
        q.scale = pf.xs;
        q.m = m;
        q.k = sh.k;
        q.scale_ld = m;
        cuda::launch_fp8_act_quant(q, pf.stream);
      });
      const double gemm = time_ms(pf.stream, 3,
                                  [&] {
                                    for (size_t i = 0; i < s.w.size(); ++i) {
                                      cuda::Fp8GemmParams g{};
                                      g.plan = plan;
                                      g.xq = pf.xq;
                                      g.x_scale = pf.xs;
                                      g.w = s.view(i);
                                      g.out = out;
                                      g.m = m;
                                      cuda::launch_fp8_gemm(g, pf.stream);
                                    }
                                  }) /
                          double(s.w.size());
      const float alpha = 1, beta = 0;
      const double bf16 =
          time_ms(
              pf.stream, 3,
              [&] {
                for (bf16_bits* w : wb)
                  CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, int(sh.n), int(m), int(sh.k),
                                     &alpha, w, CUDA_R_16BF, int(sh.k), x, CUDA_R_16BF, int(sh.k),
                                     &beta, ref, CUDA_R_16BF, int(sh.n), CUBLAS_COMPUTE_32F,
                                     CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
              }) /
          double(wb.size());
      // Same weights, same activations: the FP8 result against bf16 cuBLAS's (last copy).
      {
        cuda::Fp8LinearParams p{};
        p.plan = plan;
        p.x = x;
        p.w = s.view(s.w.size() - 1);
        p.out = out;
        p.xq = pf.xq;
        p.x_scale = pf.xs;
        p.m = m;
        cuda::launch_fp8_linear(p, pf.stream);
        CUDA_CHECK(cudaStreamSynchronize(pf.stream));
      }
      const double e = nmse_bf16(out, ref, std::min<int64_t>(m, 512) * sh.n);  // first 512 rows
      std::printf(
          "gemm     %-12s M=%-5lld act_quant %7.1f us | gemm %8.1f us %5.0f TFLOP/s | "
          "both %8.1f us | bf16 cuBLAS %8.1f us %5.0f TFLOP/s | speedup %.2fx (gemm "
          "alone %.2fx) | nmse vs bf16 %.2g\n",
          sh.name, (long long)m, quant * 1e3, gemm * 1e3, flop / (gemm * 1e-3) / 1e12, lin * 1e3,
          bf16 * 1e3, flop / (bf16 * 1e-3) / 1e12, bf16 / lin, bf16 / gemm, e);
      std::printf("gemm       %s\n", plan_text.c_str());
      sum.lines.push_back(fmt::format(
          "gemm {:<12} M={:<5} fp8 {:8.1f} us (quant {:6.1f}) bf16 {:8.1f} us: {:.2f}x ({:.2f}x "
          "without quant){}",
          sh.name, m, lin * 1e3, quant * 1e3, bf16 * 1e3, bf16 / lin, bf16 / gemm,
          m == 8192 ? (bf16 / lin >= 1.4 ? "  [>= 1.4x: met]" : "  [< 1.4x: NOT met]") : ""));
    }
    for (auto* w : wb) cudaFree(w);
    s.release();
  }
  (void)c;
  cudaFree(x);
  cudaFree(out);
  cudaFree(ref);
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) {
  using namespace strata;
  std::string what = "ceilings,gemv,gemm";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--what")
      what = argv[i + 1];
    else if (a == "--reps")
      g_reps = std::max(1, std::atoi(argv[i + 1]));
    else {
      std::fprintf(stderr, "usage: %s [--what ceilings,gemv,gemm] [--reps N]\n", argv[0]);
      return 2;
    }
  }
  auto has = [&](const char* s) { return what.find(s) != std::string::npos; };
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device   %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount,
              prop.l2CacheSize >> 20);
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const size_t ws_bytes = size_t(32) << 20;
  void* ws = nullptr;
  CUDA_CHECK(cudaMalloc(&ws, ws_bytes));
  cublasHandle_t h;
  CHECK(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS);
  CHECK(cublasSetStream(h, stream) == CUBLAS_STATUS_SUCCESS);
  CHECK(cublasSetWorkspace(h, ws, ws_bytes) == CUBLAS_STATUS_SUCCESS);
  void* lt_ws = nullptr;
  CUDA_CHECK(cudaMalloc(&lt_ws, ws_bytes));
  cuda::Fp8GemmPlanner planner(lt_ws, ws_bytes);
  Prefill pf{&planner, stream, nullptr, nullptr};
  pf.xq = dev_alloc<uint8_t>(int64_t(8192) * 18432);
  pf.xs = dev_alloc<float>(int64_t(8192) * cuda::fp8_scale_cols(18432));

  Ceilings c{1, 1};
  if (has("ceilings") || has("gemv") || has("gemm"))
    c = measure_ceilings(stream, int64_t(2) << 30, g_reps);
  Summary sum;
  if (has("gemv")) bench_gemv(c, pf, sum);
  if (has("gemm")) bench_gemm(c, pf, h, sum);
  std::printf(
      "\n== summary (copy %.0f GB/s, bf16 GEMM %.0f TFLOP/s; targets: GEMV m=1 >= 85%% of "
      "copy, GEMM M=8192 >= 1.4x bf16) ==\n",
      c.copy_gbs, c.gemm_tflops);
  for (const auto& l : sum.lines) std::printf("%s\n", l.c_str());
  cublasDestroy(h);
  return 0;
}
