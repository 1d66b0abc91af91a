// What the MoE benchmarks share (moe_bench.cc and its backend-op layer, moe_backend_layer.h):
// device allocations (tests/support/device_buffer.h's Dev), timing (events; CUDA graphs of
// back-to-back calls), the splitmix random stream and the ceilings measured in the same run (copy
// bandwidth, cuBLAS bf16 GEMM rate).
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
#include "bench_timing.h"
#include "support/device_buffer.h"

namespace strata::moe_bench {

using cuda::bf16_bits;

using testing::Dev;
using DevPtr = std::unique_ptr<Dev>;
inline DevPtr dev(size_t bytes) { return std::make_unique<Dev>(bytes); }

using bench::time_ms;

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

using bench::Ceilings;
// The shared ceilings (bench_timing.h) on 2 GiB copies; `h` is the bench's own handle, unused.
inline Ceilings measure_ceilings(cudaStream_t s, cublasHandle_t) {
  return bench::measure_ceilings(s, int64_t(2) << 30);
}

}  // namespace strata::moe_bench
