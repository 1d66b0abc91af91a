// The batch-invariant GEMM (linear_det.h). A block computes a 64 x 64 output tile with 4 warps
// (2 x 2, 32 x 32 each); x and w tiles of 32 k values go through a 4-stage cp.async pipeline in
// shared memory (rows padded to 40 elements: the ldmatrix reads of 8 rows hit 8 distinct bank
// groups). Rows past m, columns past n and k past k are zero-filled by the copies and never
// stored. The tile shape does not enter a result: each output element is accumulated by one
// thread, over k in order, one mma per 16 k values.
#include "backend/cuda/attention_mma.cuh"
#include "backend/cuda/common.cuh"
#include "backend/cuda/linear_det.h"
#include "backend/cuda/mma_sync.cuh"

namespace strata::cuda {
namespace {

using attn::cp_async16_zfill;
using attn::cp_async_commit;
using attn::cp_async_wait;
using attn::ldmatrix_x4;

constexpr int kBM = 64, kBN = 64, kBK = 32, kStages = 4;
constexpr int kPitch = kBK + 8;  // shared-memory row pitch (elements): 80 bytes
constexpr int kThreads = 128;

struct Smem {
  bf16_bits a[kStages][kBM][kPitch];
  bf16_bits b[kStages][kBN][kPitch];
};

// Copies the k tile `kt` of the block's x rows and w rows into `stage`: 64 rows x 4 chunks of 16
// bytes each, two chunks of each per thread.
__device__ __forceinline__ void load_tile(const DetGemmParams& p, const bf16_bits* x,
                                          const bf16_bits* w, int row0, int col0, int kt, int stage,
                                          Smem& s) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int c = int(threadIdx.x) + i * kThreads;  // 0..255
    const int r = c / 4, kc = (c % 4) * 8;
    const int kk = kt * kBK + kc;
    const bool kin = kk < p.k;
    {
      const int row = row0 + r;
      const bool in = kin && row < p.m;
      const bf16_bits* src = in ? x + int64_t(row) * p.ldx + kk : x;
      cp_async16_zfill(smem_addr(&s.a[stage][r][kc]), src, in ? 16 : 0);
    }
    {
      const int col = col0 + r;
      const bool in = kin && col < p.n;
      const bf16_bits* src = in ? w + int64_t(col) * p.ldw + kk : w;
      cp_async16_zfill(smem_addr(&s.b[stage][r][kc]), src, in ? 16 : 0);
    }
  }
}

__global__ void __launch_bounds__(kThreads) det_gemm_kernel(DetGemmParams p) {
  __shared__ __align__(128) Smem s;
  const int z = blockIdx.z;
  const bf16_bits* x = p.x + int64_t(z) * p.stride_x;
  const bf16_bits* w = p.w + int64_t(z) * p.stride_w;
  const int col0 = int(blockIdx.x) * kBN, row0 = int(blockIdx.y) * kBM;
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int wm = warp / 2, wn = warp % 2;  // the warp's 32 x 32 quarter of the tile
  const int ktiles = (p.k + kBK - 1) / kBK;

  float acc[2][4][4];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    if (st < ktiles) load_tile(p, x, w, row0, col0, st, st, s);
    cp_async_commit();
  }
  for (int kt = 0; kt < ktiles; ++kt) {
    cp_async_wait<kStages - 2>();  // tile kt has landed (this thread's copies)
    __syncthreads();               // ... everyone's; and the stage read at kt - 1 is free
    const int next = kt + kStages - 1;
    if (next < ktiles) load_tile(p, x, w, row0, col0, next, next % kStages, s);
    cp_async_commit();
    const int st = kt % kStages;
#pragma unroll
    for (int k16 = 0; k16 < kBK; k16 += 16) {
      uint32_t a[2][4], b[2][4];
#pragma unroll
      for (int i = 0; i < 2; ++i)  // rows wm·32 + i·16 + (lane % 16), k halves by lane / 16
        ldmatrix_x4(a[i], smem_addr(&s.a[st][wm * 32 + i * 16 + lane % 16][k16 + (lane / 16) * 8]));
#pragma unroll
      for (int j = 0; j < 2; ++j)  // weight rows wn·32 + j·16 + ..: matrices (n0, k0) (n0, k8)
                                   // (n8, k0) (n8, k8)
        ldmatrix_x4(b[j], smem_addr(&s.b[st][wn * 32 + j * 16 + lane % 8 + (lane / 16) * 8]
                                        [k16 + ((lane / 8) % 2) * 8]));
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
          mma_bf16_16816(acc[i][j], a[i], b[j / 2][(j % 2) * 2], b[j / 2][(j % 2) * 2 + 1]);
    }
  }
  cp_async_wait<0>();

  // C fragment: c0, c1 = (row g, cols 2c, 2c + 1); c2, c3 = (row g + 8, same cols).
  const int g = lane / 4, c = lane % 4;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = row0 + wm * 32 + i * 16 + g + (e / 2) * 8;
        const int col = col0 + wn * 32 + j * 8 + 2 * c + e % 2;
        if (row >= p.m || col >= p.n) continue;
        const float v = acc[i][j][e] + (p.bias ? p.bias[col] : 0.0f);
        const int64_t at = int64_t(z) * p.stride_o + int64_t(row) * p.ldo + col;
        if (p.out_f32)
          static_cast<float*>(p.out)[at] = v;
        else
          static_cast<bf16_bits*>(p.out)[at] = float_to_bf16(v);
      }
    }
  }
}

}  // namespace

bool det_gemm_supported(const DetGemmParams& p) {
  const bool strides = p.k % 8 == 0 && p.ldx % 8 == 0 && p.ldw % 8 == 0 &&
                       (p.batch <= 1 || (p.stride_x % 8 == 0 && p.stride_w % 8 == 0));
  return strides && uintptr_t(p.x) % 16 == 0 && uintptr_t(p.w) % 16 == 0;
}

void launch_det_gemm(const DetGemmParams& p, const Launch& launch) {
  if (p.m == 0 || p.n == 0) return;
  CHECK_MSG(det_gemm_supported(p), "deterministic GEMM: m {} n {} k {} ldx {} ldw {} unaligned",
            p.m, p.n, p.k, p.ldx, p.ldw);
  CHECK(p.batch >= 1 && p.batch < 65536 && ceil_div(p.m, kBM) < 65536);
  const dim3 grid(unsigned(ceil_div(p.n, kBN)), unsigned(ceil_div(p.m, kBM)), unsigned(p.batch));
  det_gemm_kernel<<<grid, kThreads, 0, launch.stream>>>(p);
  CUDA_LAUNCH_CHECK();
}

}  // namespace strata::cuda
