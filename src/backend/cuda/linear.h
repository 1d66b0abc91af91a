// Linear layers (linear.cu): out [m, n] = x [m, k] · w [n, k]ᵀ (+ bias), bf16 in and out, float32
// accumulation. Decode sizes take the GEMV below; larger m cuBLAS, with the bias as a separate
// epilogue launch.
#pragma once

#include "backend/cuda/launch.h"
#include "backend/cuda/norm.h"

namespace strata::cuda {

// out [m, n] = x [m, k] · w [n, k]ᵀ for small m: one warp per output row, bf16 weights streamed
// once with 16-byte loads (decode GEMV). Needs k % 8 == 0 and 16-byte aligned rows.
constexpr int kGemvMaxRows = 8;
// With glu_inter > 0 the weight is a fused gate-up projection [2 · glu_inter, k] and the output
// is SwiGLU's [m, glu_inter]: out[r, j] = silu(g) · u with g, u the bf16-rounded rows j and
// glu_inter + j (bias included), computed exactly as launch_silu_mul would on the GEMV's output.
// The launch tunables (CudaTunables) travel here, so a graph's signature includes them.
struct GemvParams {
  const bf16_bits* x;
  const bf16_bits* w;
  const float* bias;  // [n] or null
  bf16_bits* out;
  int m;
  int64_t n;
  int64_t k;
  int64_t glu_inter;       // 0: plain GEMV
  int64_t prefetch_elems;  // leading weights of each row prefetched into L2 before pdl_wait
                           // (with the first batch into registers); -1: the registers only
  int block_warps;         // 4 or 8 (one weight row per warp, or per KS warps)
  int max_ksplit;          // most warps sharing one output row: 1, 2 or 4
  int pdl_early;           // trigger the next kernel before waiting on the previous
  // A second GEMV on the same x in the same launch (graph mode merges two consecutive plain
  // GEMVs that read one x: MLA's q_a / q_proj and kv_a): the blocks from `blocks1` on compute
  // out2 [m, n2] = x · w2ᵀ (+ bias2) exactly as a launch of their own would (same warps a row).
  // w2 null: one GEMV.
  int blocks1;
  const bf16_bits* w2;
  const float* bias2;
  bf16_bits* out2;
  int64_t n2;
  // An RMSNorm of x's rows first (graph mode merges a GEMV of m <= 2 rows, a pair or SwiGLU
  // included, with the rms_norm or add_rms_norm just recorded for its x: norm_prologue.cc): x
  // is where the norm's output goes (block 0 stores it). norm.x null: x is read as it is.
  NormPrologue norm;
};
void launch_gemv(const GemvParams& p, const Launch& launch);
// Warps that share one output row of a plain GEMV of n rows (the launch's choice, from
// block_warps and max_ksplit), and the blocks it takes: two GEMVs merge into one launch only
// where their k splits are equal.
int gemv_ksplit(const GemvParams& p, int64_t n);
int64_t gemv_blocks(const GemvParams& p, int64_t n);

struct BiasAddParams {  // out[r, j] += bias[j] (the cuBLAS GEMM's epilogue)
  bf16_bits* out;
  const float* bias;
  int64_t rows;
  int64_t cols;
};
void launch_bias_add(const BiasAddParams& p, const Launch& launch);

}  // namespace strata::cuda
