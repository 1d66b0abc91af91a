// Linear layers: out [m, n] = x [m, k] · w [n, k]ᵀ (+ bias), bf16 in and out, float32
// accumulation. Small m (decode) streams the weights through a GEMV kernel that reads each
// weight byte once with 16-byte loads (optionally with SwiGLU as its epilogue: gate-up
// projection and silu·mul in one launch); larger m goes to cuBLAS (bf16 tensor cores).
#include <cublas_v2.h>

#include "backend/cuda/common.cuh"

namespace strata::cuda {
namespace {

constexpr int kMaxWarps = 8;  // warps per block: 8 (default) or 4 (GemvParams::block_warps)
constexpr int kUnroll = 4;  // independent 16-byte weight loads in flight per lane
// Most warps sharing one output row (the launch picks the fewest that give every SM ~48 warps of
// loads: 2 for the 8B shape's qkv, o_proj and down). H200, 2026-11-29 night: one token's GEMVs
// back to back 3.928 ms with 1, 3.847 ms with up to 4 (llama_bench --what gemv).
int g_max_ksplit = 4;
int64_t g_prefetch_elems = 0;  // off: measured slower (see the kernel's comment)
int g_block_warps = 8;
int g_max_rows = 2;  // dispatch's limit (kernels.h set_gemv_max_rows)

__device__ __forceinline__ float dot8(const float* a, const float* b) {
  float s = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) s = fmaf(a[i], b[i], s);
  return s;
}

// KS warps share each output row (interleaved 256-element blocks of k) so that small-n layers
// still put enough loads in flight on every SM; partial sums meet in shared memory.
// GLU: the block's first half of warps stream gate rows, the second half the matching up rows
// (KS = 1), and the first half writes silu(gate) · up.
// With prefetch_elems > 0, before waiting on its predecessor (PDL) every warp prefetches the
// leading weights of its row into L2 and its first batch into registers: weights are never
// written by a kernel, so the stream could start while the previous kernel still runs. Off by
// default: on the H200 it made every GEMV slower (back to back, 8B shapes: 3.93 -> 4.37 ms per
// token's GEMVs, lm_head alone 237 -> 255 us; in the decode step +0.2 ms/token), most likely
// because the prefetches double the requests the L2 serves for the same bytes.
template <int M, int KS, bool GLU>
__global__ void __launch_bounds__(kMaxWarps * 32) gemv_kernel(GemvParams p) {
  if (p.pdl_early) pdl_trigger();
  __shared__ float red[kMaxWarps][M];
  const int warps = int(blockDim.x / 32);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int64_t n, col;  // the weight row this warp streams; the output column it feeds
  bool valid;
  int part = 0;
  if constexpr (GLU) {
    const int half = warps / 2;
    col = int64_t(blockIdx.x) * half + warp % half;
    valid = col < p.glu_inter;
    n = col + (warp < half ? 0 : p.glu_inter);
  } else {
    col = n = int64_t(blockIdx.x) * (warps / KS) + warp / KS;
    part = warp % KS;
    valid = n < p.n;
  }
  const bf16_bits* wrow = p.w + n * p.k;
  constexpr int kStep = KS * 256;
  const int64_t k0 = int64_t(part) * 256 + lane * 8;
  // With the prefetch on, the first batch of this lane's weights also goes to registers.
  const bool preloaded = valid && p.prefetch_elems > 0 && k0 + (kUnroll - 1) * kStep < p.k;
  uint4 wv[kUnroll];
  if (preloaded) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      wv[u] = __ldcs(reinterpret_cast<const uint4*>(wrow + k0 + u * kStep));
  }
  if (valid && part == 0) {
    const int64_t pf = p.prefetch_elems < p.k ? p.prefetch_elems : p.k;
    for (int64_t e = int64_t(lane) * 64; e < pf; e += 32 * 64) prefetch_l2(wrow + e);
  }
  pdl_wait();
  if (!p.pdl_early) pdl_trigger();
  float acc[M];
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = 0;
  if (valid) {
    int64_t k = k0;
    for (; k + (kUnroll - 1) * kStep < p.k; k += kUnroll * kStep) {
      if (k != k0 || !preloaded) {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
          wv[u] = __ldcs(reinterpret_cast<const uint4*>(wrow + k + u * kStep));
      }
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
    for (; k < p.k; k += kStep) {  // the tail (k not a multiple of the unrolled step)
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
  if constexpr (GLU) {
    const int half = warps / 2;
    if (lane == 0 && warp >= half) {
#pragma unroll
      for (int m = 0; m < M; ++m) red[warp][m] = acc[m];
    }
    __syncthreads();
    if (lane == 0 && warp < half && valid) {
      const float bg = p.bias ? p.bias[col] : 0.0f;
      const float bu = p.bias ? p.bias[col + p.glu_inter] : 0.0f;
#pragma unroll
      for (int m = 0; m < M; ++m) {
        // The unfused path's roundings: the GEMV stores gate and up in bf16, silu_mul reads them.
        const float g = bf16_to_float(float_to_bf16(acc[m] + bg));
        const float u = bf16_to_float(float_to_bf16(red[warp + half][m] + bu));
        p.out[m * p.glu_inter + col] = float_to_bf16(g / (1.0f + __expf(-g)) * u);
      }
    }
    return;
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
  if (lane == 0 && part == 0 && valid) {
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
  const int warps = p.block_warps == 4 ? 4 : kMaxWarps;
  const dim3 block(unsigned(warps * 32));
  if (p.glu_inter > 0) {
    launch_pdl(gemv_kernel<M, 1, true>, dim3(unsigned(ceil_div(p.glu_inter, warps / 2))), block, 0,
               stream, p);
    CUDA_LAUNCH_CHECK();
    return;
  }
  // The fewest warps per row that give every SM ~48 warps of loads in flight.
  int ks = 1;
  while (ks < g_max_ksplit && ks < warps && p.n * ks < int64_t(num_sms()) * 48) ks *= 2;
  const dim3 grid(unsigned(ceil_div(p.n, warps / ks)));
  if (ks == 1) launch_pdl(gemv_kernel<M, 1, false>, grid, block, 0, stream, p);
  else if (ks == 2) launch_pdl(gemv_kernel<M, 2, false>, grid, block, 0, stream, p);
  else launch_pdl(gemv_kernel<M, 4, false>, grid, block, 0, stream, p);
  CUDA_LAUNCH_CHECK();
}

}  // namespace

void set_gemv_max_ksplit(int ks) {
  CHECK(ks == 1 || ks == 2 || ks == 4);
  g_max_ksplit = ks;
}
void set_gemv_prefetch_elems(int64_t elems) { g_prefetch_elems = elems < 0 ? 0 : elems; }
int64_t gemv_prefetch_elems() { return g_prefetch_elems; }
void set_gemv_block_warps(int warps) {
  CHECK(warps == 4 || warps == 8);
  g_block_warps = warps;
}
int gemv_block_warps() { return g_block_warps; }
void set_gemv_max_rows(int rows) {
  CHECK(rows >= 1 && rows <= kGemvMaxRows);
  g_max_rows = rows;
}
int gemv_max_rows() { return g_max_rows; }

void launch_gemv(const GemvParams& p, cudaStream_t stream) {
  if (p.m == 0 || p.n == 0) return;
  CHECK(p.k % 8 == 0 && uintptr_t(p.x) % 16 == 0 && uintptr_t(p.w) % 16 == 0);
  CHECK(p.glu_inter == 0 || p.n == 2 * p.glu_inter);
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
