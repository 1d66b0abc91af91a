// Linear layers: out [m, n] = x [m, k] · w [n, k]ᵀ (+ bias), bf16 in and out, float32
// accumulation. Small m (decode) streams the weights through a GEMV kernel that reads each
// weight byte once with 16-byte loads; larger m goes to cuBLAS (bf16 tensor cores).
#include <cublas_v2.h>

#include "backend/cuda/common.cuh"

namespace strata::cuda {
namespace {

constexpr int kGemvWarps = 8;
constexpr int kUnroll = 4;  // independent 16-byte weight loads in flight per lane
int g_max_ksplit = 1;  // most warps sharing one output row: 1 measured best on H200 (bench)

__device__ __forceinline__ float dot8(const float* a, const float* b) {
  float s = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) s = fmaf(a[i], b[i], s);
  return s;
}

// KS warps share each output row (interleaved 256-element blocks of k) so that small-n layers
// still put enough loads in flight on every SM; partial sums meet in shared memory.
template <int M, int KS>
__global__ void __launch_bounds__(kGemvWarps * 32) gemv_kernel(GemvParams p) {
  pdl_wait();
  pdl_trigger();
  constexpr int kRows = kGemvWarps / KS;
  __shared__ float red[kGemvWarps][M];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t n = int64_t(blockIdx.x) * kRows + warp / KS;
  const int part = warp % KS;
  float acc[M];
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = 0;
  if (n < p.n) {
    const bf16_bits* wrow = p.w + n * p.k;
    constexpr int kStep = KS * 256;
    int64_t k = int64_t(part) * 256 + lane * 8;
    for (; k + (kUnroll - 1) * kStep < p.k; k += kUnroll * kStep) {
      uint4 wv[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        wv[u] = __ldcs(reinterpret_cast<const uint4*>(wrow + k + u * kStep));
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        float wf[8];
        unpack8(wv[u], wf);
#pragma unroll
        for (int m = 0; m < M; ++m) {
          float xf[8];
          unpack8(__ldg(reinterpret_cast<const uint4*>(p.x + m * p.k + k + u * kStep)), xf);
          acc[m] += dot8(wf, xf);
        }
      }
    }
    for (; k < p.k; k += kStep) {
      float wf[8];
      unpack8(__ldcs(reinterpret_cast<const uint4*>(wrow + k)), wf);
#pragma unroll
      for (int m = 0; m < M; ++m) {
        float xf[8];
        unpack8(__ldg(reinterpret_cast<const uint4*>(p.x + m * p.k + k)), xf);
        acc[m] += dot8(wf, xf);
      }
    }
  }
#pragma unroll
  for (int m = 0; m < M; ++m) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc[m] += __shfl_xor_sync(0xffffffffu, acc[m], o);
  }
  if (KS > 1) {
    if (lane == 0) {
#pragma unroll
      for (int m = 0; m < M; ++m) red[warp][m] = acc[m];
    }
    __syncthreads();
    if (lane == 0 && part == 0) {
#pragma unroll
      for (int m = 0; m < M; ++m) {
        float s = 0;
#pragma unroll
        for (int j = 0; j < KS; ++j) s += red[warp + j][m];
        acc[m] = s;
      }
    }
  }
  if (lane == 0 && part == 0 && n < p.n) {
    const float b = p.bias ? p.bias[n] : 0.0f;
#pragma unroll
    for (int m = 0; m < M; ++m) p.out[m * p.n + n] = float_to_bf16(acc[m] + b);
  }
}

int num_sms() {
  static const int sms = [] {
    int dev = 0, n = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    return n;
  }();
  return sms;
}

template <int M>
void launch_gemv_m(const GemvParams& p, cudaStream_t stream) {
  // The fewest warps per row that give every SM ~48 warps of loads in flight.
  int ks = 1;
  while (ks < g_max_ksplit && p.n * ks < int64_t(num_sms()) * 48) ks *= 2;
  const dim3 block(kGemvWarps * 32);
  const dim3 grid(unsigned(ceil_div(p.n, kGemvWarps / ks)));
  if (ks == 1) launch_pdl(gemv_kernel<M, 1>, grid, block, 0, stream, p);
  else if (ks == 2) launch_pdl(gemv_kernel<M, 2>, grid, block, 0, stream, p);
  else launch_pdl(gemv_kernel<M, 4>, grid, block, 0, stream, p);
}

}  // namespace

void set_gemv_max_ksplit(int ks) {
  CHECK(ks == 1 || ks == 2 || ks == 4);
  g_max_ksplit = ks;
}

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
}

}  // namespace strata::cuda
