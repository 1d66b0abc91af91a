// Warp-level tensor-core helpers of the attention kernels: cp.async with zero fill, ldmatrix,
// bf16x2 packing and exp2 (mma.sync m16n8k16 itself: mma_sync.cuh).
//
// Fragment layouts of mma.m16n8k16.row.col (lane = 4·g + c, g = lane / 4, c = lane % 4):
//   A (16×16, row-major): a0 = (row g, k 2c..2c+1), a1 = (row g+8, k 2c..), a2 = (row g, k 2c+8..),
//                         a3 = (row g+8, k 2c+8..)
//   B (16×8, "col"):      b0 = (k 2c..2c+1, col g), b1 = (k 2c+8.., col g)
//   C (16×8, float):      c0, c1 = (row g, col 2c, 2c+1), c2, c3 = (row g+8, col 2c, 2c+1)
// so the accumulator of S = Q·Kᵀ is, packed to bf16 pairs, the A fragment of P·V.
#pragma once

#include <cstdint>

#include "backend/cuda/common.cuh"
#include "backend/cuda/mma_sync.cuh"

namespace strata::cuda::attn {

// 16 bytes global -> shared, bypassing L1; `bytes` = 0 fills the 16 bytes with zeros instead.
__device__ __forceinline__ void cp_async16_zfill(uint32_t dst, const void* src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Four 8×8 b16 matrices; lane l gives the address of row l % 8 of matrix l / 8.
__device__ __forceinline__ void ldmatrix_x4(uint32_t* r, uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t* r, uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// Two floats as a bf16 pair (lo in the low half), round to nearest even: one instruction.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// 2^x (MUFU.EX2, flush to zero; exp2(-inf) = 0).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace strata::cuda::attn
