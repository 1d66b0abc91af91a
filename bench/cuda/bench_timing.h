// Event timing and the two hardware ceilings that every CUDA benchmark prints beside its numbers
// (bench/RESULTS.md's rule: a figure is stated against a ceiling measured in the same run).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "backend/cuda/elementwise.h"
#include "backend/cuda/launch.h"
#include "core/check.h"

namespace strata::bench {

// Milliseconds of `fn` (device work enqueued on `stream`), timed with events: the median of `reps`
// runs after `warmup` untimed ones (the median, not the mean: one preempted run must not move it).
template <typename F>
double time_ms(cudaStream_t stream, int warmup, int reps, F&& fn) {
  for (int i = 0; i < warmup; ++i) fn();
  CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<float> ms;
  cudaEvent_t a, b;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < reps; ++i) {
    CUDA_CHECK(cudaEventRecord(a, stream));
    fn();
    CUDA_CHECK(cudaEventRecord(b, stream));
    CUDA_CHECK(cudaEventSynchronize(b));
    float t = 0;
    CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

struct Ceilings {
  double copy_gbs = 0;     // device-to-device copy, (read + write) bytes / s
  double gemm_tflops = 0;  // cuBLAS bf16 GEMM 8192³, float32 accumulation
};

// Measures both ceilings on `stream` (a copy of `copy_bytes`, large enough that L2 does not count;
// the GEMM on random bf16 data: zeros would let the tensor cores idle) and prints them. Each is
// the best of three medians of `reps`, after ~0.2 s of the same work untimed: a GPU that starts a
// process at idle clocks read the GEMM rate as 722-786 TFLOP/s from one process to the next on one
// H100 with three warm-up calls (2026-12-05-session33.md), enough to move a "% of GEMM" verdict
// by 4 points. The best rate is the ceiling a kernel is held to; the medians' spread is printed.
inline Ceilings measure_ceilings(cudaStream_t stream, int64_t copy_bytes = int64_t(4) << 30,
                                 int reps = 10) {
  auto alloc = [](int64_t bytes) {
    void* p = nullptr;
    CUDA_CHECK(cudaMalloc(&p, size_t(bytes)));
    return p;
  };
  // The best of three medians after `fn` has run untimed for at least ~0.2 s (the clocks ramped).
  auto best_ms = [&](auto&& fn, double* spread) {
    for (double warm = 0; warm < 200.0;)
      warm += time_ms(stream, 0, 1, [&] {
        for (int i = 0; i < reps; ++i) fn();
      });
    double lo = 1e30, hi = 0;
    for (int round = 0; round < 3; ++round) {
      const double ms = time_ms(stream, 1, reps, fn);
      lo = std::min(lo, ms);
      hi = std::max(hi, ms);
    }
    *spread = hi / lo - 1.0;
    return lo;
  };
  Ceilings c;
  double copy_spread = 0, gemm_spread = 0;
  void* src = alloc(copy_bytes);
  void* dst = alloc(copy_bytes);
  cuda::launch_fill_random_bf16(static_cast<cuda::bf16_bits*>(src), copy_bytes / 2, 7, 1.0f,
                                stream);
  const double copy_ms = best_ms(
      [&] {
        CUDA_CHECK(cudaMemcpyAsync(dst, src, size_t(copy_bytes), cudaMemcpyDeviceToDevice, stream));
      },
      &copy_spread);
  c.copy_gbs = 2.0 * double(copy_bytes) / (copy_ms * 1e-3) / 1e9;
  CUDA_CHECK(cudaFree(src));
  CUDA_CHECK(cudaFree(dst));

  const int n = 8192;
  const int64_t elems = int64_t(n) * n;
  auto* a = static_cast<cuda::bf16_bits*>(alloc(elems * 2));
  auto* b = static_cast<cuda::bf16_bits*>(alloc(elems * 2));
  void* o = alloc(elems * 2);
  cuda::launch_fill_random_bf16(a, elems, 1, 1.0f, stream);
  cuda::launch_fill_random_bf16(b, elems, 2, 1.0f, stream);
  cublasHandle_t h;
  CHECK(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS);
  cublasSetStream(h, stream);
  const float alpha = 1, beta = 0;
  const double gemm_ms = best_ms(
      [&] {
        CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &alpha, a, CUDA_R_16BF, n, b,
                           CUDA_R_16BF, n, &beta, o, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                           CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
      },
      &gemm_spread);
  cublasDestroy(h);
  c.gemm_tflops = 2.0 * n * double(n) * n / (gemm_ms * 1e-3) / 1e12;
  CUDA_CHECK(cudaFree(a));
  CUDA_CHECK(cudaFree(b));
  CUDA_CHECK(cudaFree(o));
  std::printf(
      "ceiling  D2D copy %.0f GB/s (read+write, %.0f GiB, best of 3 medians of %d, spread "
      "%.1f%%)\n",
      c.copy_gbs, double(copy_bytes) / double(int64_t(1) << 30), reps, 100.0 * copy_spread);
  std::printf(
      "ceiling  cuBLAS bf16 GEMM 8192^3: %.0f TFLOP/s (best of 3 medians of %d, spread %.1f%%, "
      "random data)\n",
      c.gemm_tflops, reps, 100.0 * gemm_spread);
  return c;
}

}  // namespace strata::bench
