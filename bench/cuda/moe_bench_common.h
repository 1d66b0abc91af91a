// What the MoE benchmarks share (moe_bench.cc and its backend-op layer, moe_backend_layer.h):
// device allocations, timing (events; CUDA graphs of back-to-back calls), the splitmix random
// stream and the ceilings measured in the same run (copy bandwidth, cuBLAS bf16 GEMM rate).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <vector>

#include "backend/cuda/elementwise.h"
#include "backend/cuda/launch.h"

namespace strata::moe_bench {

using cuda::bf16_bits;

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
using DevPtr = std::unique_ptr<Dev>;
inline DevPtr dev(size_t bytes) { return std::make_unique<Dev>(bytes); }

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

// Microseconds per call of `enqueue(i)` for i < calls, captured as one CUDA graph.
template <typename F>
double graph_us(cudaStream_t s, int calls, int reps, F&& enqueue) {
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < calls; ++i) enqueue(i);
  CUDA_CHECK(cudaStreamEndCapture(s, &g));
  CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
  const double ms = time_ms(s, 1, reps, [&] { CUDA_CHECK(cudaGraphLaunch(ge, s)); });
  CUDA_CHECK(cudaGraphExecDestroy(ge));
  CUDA_CHECK(cudaGraphDestroy(g));
  return ms * 1e3 / calls;
}

inline int64_t ceil_div_i64(int64_t a, int64_t b) { return (a + b - 1) / b; }

inline uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

struct Ceilings {
  double copy_gbs = 0, gemm_tflops = 0;
};
inline Ceilings measure_ceilings(cudaStream_t s, cublasHandle_t h) {
  Ceilings c;
  {
    const size_t bytes = size_t(2) << 30;
    Dev src(bytes), dst(bytes);
    cuda::launch_fill_random_bf16(src.as<bf16_bits>(), int64_t(bytes / 2), 7, 1.0f, s);
    const double ms = time_ms(s, 3, 10, [&] {
      CUDA_CHECK(
          cudaMemcpyAsync(dst.as<void>(), src.as<void>(), bytes, cudaMemcpyDeviceToDevice, s));
    });
    c.copy_gbs = 2.0 * double(bytes) / (ms * 1e-3) / 1e9;
  }
  const int n = 8192;
  Dev a(size_t(n) * n * 2), b(size_t(n) * n * 2), o(size_t(n) * n * 2);
  cuda::launch_fill_random_bf16(a.as<bf16_bits>(), int64_t(n) * n, 1, 1.0f, s);
  cuda::launch_fill_random_bf16(b.as<bf16_bits>(), int64_t(n) * n, 2, 1.0f, s);
  const float alpha = 1, beta = 0;
  const double ms = time_ms(s, 3, 10, [&] {
    CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &alpha, a.as<void>(), CUDA_R_16BF, n,
                       b.as<void>(), CUDA_R_16BF, n, &beta, o.as<void>(), CUDA_R_16BF, n,
                       CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
  });
  c.gemm_tflops = 2.0 * n * double(n) * n / (ms * 1e-3) / 1e12;
  std::printf("ceiling  D2D copy %.0f GB/s (read+write, 2 GiB, median of 10)\n", c.copy_gbs);
  std::printf("ceiling  cuBLAS bf16 GEMM 8192^3: %.0f TFLOP/s (median of 10)\n", c.gemm_tflops);
  return c;
}

}  // namespace strata::moe_bench
