// The per-head GEMV (per_head_gemv.h). Each output row (head h, row n) is a dot product of k
// values: `lanes` lanes of a warp share it, 8 bf16 (one 16-byte load) at a time, and reduce with
// shuffles; a warp holds 32 / lanes rows, the tokens' sums side by side in registers. Float32
// accumulation, one bf16 rounding of the result (as the GEMM it replaces; the summation order
// differs, so the last bit may).
#include <algorithm>

#include "backend/cuda/common.cuh"
#include "backend/cuda/per_head_gemv.h"

namespace strata::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kPreload = 4;  // weight pieces a lane loads before the PDL wait

__global__ void __launch_bounds__(kWarps * 32) per_head_gemv_kernel(PerHeadGemvParams p) {
  const int lane = threadIdx.x % 32, lanes = p.lanes, rows_per_warp = 32 / lanes;
  const int sub = lane / lanes, sl = lane % lanes;
  const int64_t total = int64_t(p.heads) * p.n;
  const int64_t warp = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int64_t stride = int64_t(gridDim.x) * kWarps * rows_per_warp;
  // The first row's leading weights (up to kPreload pieces a lane) load before the PDL wait:
  // weights are never written by a kernel, and at decode sizes (MLA's W_UK / W_UV: one to four
  // pieces a lane) this is the whole row, so the wait is followed by x alone.
  uint4 pre[kPreload];
  {
    const int64_t r = warp * rows_per_warp + sub;
    if (r < total) {
      const bf16_bits* wr = p.w + r * p.k;
#pragma unroll
      for (int i = 0; i < kPreload; ++i) {
        const int k0 = sl * 8 + i * lanes * 8;
        if (k0 < p.k) pre[i] = *reinterpret_cast<const uint4*>(wr + k0);
      }
    }
  }
  pdl_enter(p.pdl_early);
  bool first = true;
  // r0 is the same for the whole warp, so every lane reaches the shuffles below.
  for (int64_t r0 = warp * rows_per_warp; r0 < total; r0 += stride) {
    const int64_t r = r0 + sub;
    const bool valid = r < total;
    const int h = valid ? int(r / p.n) : 0;
    const int row = valid ? int(r % p.n) : 0;
    float acc[kPerHeadGemvMaxTokens];
#pragma unroll
    for (int t = 0; t < kPerHeadGemvMaxTokens; ++t) acc[t] = 0.0f;
    if (valid) {
      const bf16_bits* wr = p.w + (int64_t(h) * p.n + row) * p.k;
      const bf16_bits* xh = p.x + int64_t(h) * p.stride_x;
      int i = 0;
      for (int k0 = sl * 8; k0 < p.k; k0 += lanes * 8, ++i) {
        float wv[8];
        uint4 wq;
        if (first && i < kPreload) {
#pragma unroll
          for (int j = 0; j < kPreload; ++j)  // a register array indexed by constants only
            if (j == i) wq = pre[j];
        } else {
          wq = *reinterpret_cast<const uint4*>(wr + k0);
        }
        unpack8(wq, wv);
#pragma unroll
        for (int t = 0; t < kPerHeadGemvMaxTokens; ++t) {
          if (t < p.tokens) {
            float xv[8];
            unpack8(*reinterpret_cast<const uint4*>(xh + t * p.ldx + k0), xv);
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[t] = fmaf(wv[e], xv[e], acc[t]);
          }
        }
      }
    }
    first = false;
#pragma unroll
    for (int t = 0; t < kPerHeadGemvMaxTokens; ++t)
      for (int o = lanes / 2; o > 0; o >>= 1) acc[t] += __shfl_xor_sync(0xffffffffu, acc[t], o);
    if (valid && sl == 0) {
#pragma unroll
      for (int t = 0; t < kPerHeadGemvMaxTokens; ++t)
        if (t < p.tokens) p.out[t * p.ldo + int64_t(h) * p.stride_o + row] = float_to_bf16(acc[t]);
    }
  }
}

}  // namespace

bool per_head_gemv_fits(const PerHeadGemvParams& p) {
  const auto aligned = [](const void* q) { return uintptr_t(q) % 16 == 0; };
  return p.tokens >= 1 && p.tokens <= kPerHeadGemvMaxTokens && p.k >= 8 && p.k % 8 == 0 &&
         p.ldx % 8 == 0 && p.stride_x % 8 == 0 && aligned(p.x) && aligned(p.w) && p.heads > 0 &&
         p.n > 0;
}

void per_head_gemv_set_lanes(PerHeadGemvParams& p) {
  int lanes = 1;
  while (lanes < 32 && lanes * 2 * 8 <= p.k) lanes *= 2;
  p.lanes = lanes;
}

void launch_per_head_gemv(const PerHeadGemvParams& p, const Launch& launch) {
  const int64_t rows = int64_t(p.heads) * p.n, per_block = int64_t(kWarps) * (32 / p.lanes);
  const int64_t blocks = std::min<int64_t>(ceil_div(rows, per_block), int64_t(1) << 20);
  launch_pdl(per_head_gemv_kernel, dim3(unsigned(blocks)), dim3(kWarps * 32), 0, launch, p);
  CUDA_LAUNCH_CHECK();
}

}  // namespace strata::cuda
