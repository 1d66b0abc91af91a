// The batch-invariant GEMM of the deterministic mode (CudaTunables::deterministic): out [m, n] =
// x [m, k] · w [n, k]ᵀ (+ bias), bf16 in, bf16 or float32 out, on mma.sync tensor cores with one
// fixed tile and no split-K.
//
// Why a kernel of our own: cuBLAS chooses its algorithm (tile, split-K, reduction scheme) by the
// problem's m, so a row's result changes with the number of rows beside it; the decode GEMV
// (linear.cu) sums differently from any GEMM. Here every output element is the same sequence of
// float32 accumulations whatever m, the row's place in the tile or the grid: k in steps of 16
// from 0 upward, each step one mma.m16n8k16 of that row's x values and that column's weights
// (the k tail zero-filled). Only k fixes the order, so a row gives the same bits alone, in a
// batch of any size and at any position, in prefill and in decode.
#pragma once

#include <cstdint>

#include "backend/cuda/launch.h"

namespace strata::cuda {

struct DetGemmParams {
  const bf16_bits* x;  // [batch][m rows of stride ldx]
  const bf16_bits* w;  // [batch][n rows of stride ldw]
  const float* bias;   // [n] or null: added in float32 before the output's rounding
  void* out;           // [batch][m rows of stride ldo]: bf16, or float32 when out_f32
  int m, n, k;
  int ldx, ldw, ldo;
  int batch;  // >= 1 (grid z)
  int out_f32;
  int64_t stride_x, stride_w, stride_o;  // elements between batch entries
};

// Whether the kernel takes these operands: k, the row strides and the batch strides multiples of
// 8 elements, x and w 16-byte aligned (every tile load is one 16-byte cp.async).
bool det_gemm_supported(const DetGemmParams& p);
void launch_det_gemm(const DetGemmParams& p, const Launch& launch);

}  // namespace strata::cuda
