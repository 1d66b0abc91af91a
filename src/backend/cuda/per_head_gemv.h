// The per-head linear at decode sizes (MLA's absorbed W_UK / W_UV, arch/mla.h) as one GEMV launch
// with programmatic dependent launch (per_head_gemv.cu): out[t, h, n] = Σ_k x[t, h, k] · w[h, n, k]
// for up to kPerHeadGemvMaxTokens tokens. cuBLAS's batched GEMM (the path above that) takes no
// part in the decode step's PDL chain: its launch waits on the kernel before it and the next
// kernel waits on its end, twice per layer.
#pragma once

#include "backend/cuda/launch.h"

namespace strata::cuda {

constexpr int kPerHeadGemvMaxTokens = 8;

struct PerHeadGemvParams {
  const bf16_bits* x;  // x[t · ldx + h · stride_x + k]
  const bf16_bits* w;  // w[(h · n + row) · k + kk], [heads, n, k]
  bf16_bits* out;      // out[t · ldo + h · stride_o + row]
  int64_t tokens;      // <= kPerHeadGemvMaxTokens
  int64_t ldx, ldo, stride_x, stride_o;
  int heads, n, k;
  int lanes;  // lanes that share one output row: a power of 2, <= 32, lanes · 8 <= k
  int pdl_early;
  int reserved_zero;  // keeps the struct free of padding (its bytes are a graph's signature)
};

// Whether the kernel takes these sizes: tokens within its bound, k and every row offset of x and
// w a multiple of 8 elements (16-byte loads), 16-byte aligned bases.
bool per_head_gemv_fits(const PerHeadGemvParams& p);
// Fills p.lanes for p.k.
void per_head_gemv_set_lanes(PerHeadGemvParams& p);
void launch_per_head_gemv(const PerHeadGemvParams& p, const Launch& launch);

}  // namespace strata::cuda
