// x staged in f16 for the FP8 experts' decode GEMV (moe_experts.h, MoeStageF16Params).
//
// Why: the FP8 GEMV multiplied bf16 x by bf16(w · s), and turning each e4m3 pair into that bf16
// pair took ~7.5 instructions (143 warp instructions a 512-byte tile against bf16's 51; issue-
// bound at 35-45% of copy, 2026-12-03-session16.md). Every e4m3 value is an f16, so with x in
// f16 a pair is one cvt and the block scale goes onto the tile's float32 sums. x in f16 loses
// nothing that matters: each row is multiplied by the power of two that puts its largest |x| in
// [2^14, 2^15) (f16's top binade is [2^15, 65504]: nothing overflows), where every bf16 value
// of the row down to 2^-31 of that largest is exact (f16 holds 11 significant bits down to 2^-14
// and is exact for a bf16's 8 bits down to 2^-17); smaller ones round to f16's subnormal step,
// an absolute error of at most 2^-40 of the row's largest, far below the output's bf16 rounding.
//
// The f16 row is stored in the fp8 tiles' fragment order (moe_experts.h): each 32 columns hold
// the 8 values of mma lane column c (c = 0..3) at 8c, so the GEMV loads a lane's B fragments of
// a tile's two k16 steps with one 16-byte load instead of four 4-byte ones.
//
// One CTA a row: the row's largest magnitude (bf16 bits compare as integers), then the row
// again (from L1) scaled, rounded to f16 and placed.
#include "backend/cuda/common.cuh"
#include "backend/cuda/moe_experts.h"
#include "backend/cuda/moe_stage_f16.cuh"

namespace strata::cuda {
namespace {

using namespace moe;

constexpr int kStageMaxThreads = 256;

__global__ void __launch_bounds__(kStageMaxThreads) moe_stage_f16_kernel(MoeStageF16Params p) {
  __shared__ uint32_t warp_max[kStageMaxThreads / 32];
  __shared__ int row_e;
  pdl_enter(p.pdl_early);
  const int64_t row = blockIdx.x, chunks = p.k / 8;
  const uint4* src = reinterpret_cast<const uint4*>(p.x + row * p.k);
  const int tid = int(threadIdx.x), lane = tid % 32, warp = tid / 32;
  uint32_t m = 0;  // the largest |x| as bf16 bits (NaN above +inf)
  for (int64_t i = tid; i < chunks; i += blockDim.x) {
    const uint4 v = __ldg(src + i);
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) m = abs_max_bits(m, w[j]);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
  if (lane == 0) warp_max[warp] = m;
  __syncthreads();
  if (tid == 0) {
    for (int w = 1; w < int(blockDim.x) / 32; ++w) m = max(m, warp_max[w]);
    const int e = stage_exponent(m);
    row_e = e;
    p.inv[row] = pow2f(-e);
  }
  __syncthreads();
  const float scale = pow2f(row_e);
  uint4* dst = reinterpret_cast<uint4*>(p.x16 + row * p.k);
  const uint32_t* src32 = reinterpret_cast<const uint32_t*>(p.x + row * p.k);
  for (int64_t i = tid; i < chunks; i += blockDim.x) {  // piece i (moe_stage_f16.cuh)
    const uint32_t word0 = stage_word(uint32_t(i));
    const uint32_t w[4] = {__ldg(src32 + word0), __ldg(src32 + word0 + 4), __ldg(src32 + word0 + 8),
                           __ldg(src32 + word0 + 12)};
    dst[i] = stage_piece(w, scale);
  }
}

}  // namespace

void launch_moe_stage_f16(const MoeStageF16Params& p, cudaStream_t stream) {
  CHECK_MSG(p.k > 0 && p.k % 32 == 0, "moe stage f16: k {} (a multiple of 32)", p.k);
  CHECK(uintptr_t(p.x) % 16 == 0 && uintptr_t(p.x16) % 16 == 0);
  if (p.rows <= 0) return;
  CHECK_MSG(p.rows <= 0x7fffffff, "moe stage f16: {} rows", p.rows);
  const int threads = int(std::min<int64_t>(kStageMaxThreads, ceil_div(p.k / 8, 32) * 32));
  launch_pdl(moe_stage_f16_kernel, dim3(unsigned(p.rows)), dim3(unsigned(threads)), 0,
             Launch{stream}, p);
  CUDA_LAUNCH_CHECK();
}

}  // namespace strata::cuda
