// Linear layers: out [m, n] = x [m, k] · w [n, k]ᵀ (+ bias), bf16 in and out, float32
// accumulation. Small m (decode) streams the weights through a GEMV kernel that reads each
// weight byte once with 16-byte loads; larger m goes to cuBLAS (bf16 tensor cores).
#include <cublas_v2.h>

#include "backend/cuda/common.cuh"

namespace strata::cuda {
namespace {

constexpr int kGemvWarps = 8;
constexpr int kUnroll = 4;  // independent 16-byte weight loads in flight per lane

__device__ __forceinline__ float dot8(const float* a, const float* b) {
  float s = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) s = fmaf(a[i], b[i], s);
  return s;
}

template <int M>
__global__ void __launch_bounds__(kGemvWarps * 32) gemv_kernel(GemvParams p) {
  pdl_wait();
  pdl_trigger();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t n = int64_t(blockIdx.x) * kGemvWarps + warp;
  if (n >= p.n) return;
  const bf16_bits* wrow = p.w + n * p.k;
  float acc[M];
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = 0;
  int64_t k = int64_t(lane) * 8;
  for (; k + (kUnroll - 1) * 256 < p.k; k += kUnroll * 256) {
    uint4 wv[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) wv[u] = __ldcs(reinterpret_cast<const uint4*>(wrow + k + u * 256));
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      float wf[8];
      unpack8(wv[u], wf);
#pragma unroll
      for (int m = 0; m < M; ++m) {
        float xf[8];
        unpack8(__ldg(reinterpret_cast<const uint4*>(p.x + m * p.k + k + u * 256)), xf);
        acc[m] += dot8(wf, xf);
      }
    }
  }
  for (; k < p.k; k += 256) {
    float wf[8];
    unpack8(__ldcs(reinterpret_cast<const uint4*>(wrow + k)), wf);
#pragma unroll
    for (int m = 0; m < M; ++m) {
      float xf[8];
      unpack8(__ldg(reinterpret_cast<const uint4*>(p.x + m * p.k + k)), xf);
      acc[m] += dot8(wf, xf);
    }
  }
#pragma unroll
  for (int m = 0; m < M; ++m) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc[m] += __shfl_xor_sync(0xffffffffu, acc[m], o);
  }
  if (lane == 0) {
    const float b = p.bias ? p.bias[n] : 0.0f;
#pragma unroll
    for (int m = 0; m < M; ++m) p.out[m * p.n + n] = float_to_bf16(acc[m] + b);
  }
}

template <int M>
void launch_gemv_m(const GemvParams& p, cudaStream_t stream) {
  launch_pdl(gemv_kernel<M>, dim3(unsigned(ceil_div(p.n, kGemvWarps))), dim3(kGemvWarps * 32), 0, stream, p);
}

}  // namespace

void launch_gemv(const GemvParams& p, cudaStream_t stream) {
  if (p.m == 0 || p.n == 0) return;
  CHECK(p.k % 8 == 0 && uintptr_t(p.x) % 16 == 0 && uintptr_t(p.w) % 16 == 0);
  switch (p.m) {
    case 1: launch_gemv_m<1>(p, stream); break;
    case 2: launch_gemv_m<2>(p, stream); break;
    case 3: launch_gemv_m<3>(p, stream); break;
    case 4: launch_gemv_m<4>(p, stream); break;
    case 5: launch_gemv_m<5>(p, stream); break;
    case 6: launch_gemv_m<6>(p, stream); break;
    case 7: launch_gemv_m<7>(p, stream); break;
    case 8: launch_gemv_m<8>(p, stream); break;
    default: CHECK_MSG(false, "gemv: {} rows (max {})", p.m, kGemvMaxRows);
  }
  CUDA_LAUNCH_CHECK();
}

}  // namespace strata::cuda
