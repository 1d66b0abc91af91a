// A per-head GEMV and the linear that reads its output, in one launch (graph mode merges them:
// CudaBackend::merge_head_gemv_linear, CudaTunables::head_gemv_linear_fusion): MLA's W_UV (each
// head's latent attention output into its v rows, per_head_gemv.h) and o_proj (linear.h's
// GEMV) at up to 2 tokens.
//
// Why: at batch 1 a Kimi-K2.5 rank's W_UV streams 1 MB and o_proj 14.7 MB, ~3.7 µs at the H200's
// bandwidth, but from the split merge's end to o_proj's end a layer took ~8.8 µs (W_UV 3.5, o_proj
// 5.3: H200 timeline, bench/results/2026-12-04-session24.md): o_proj's weights stream only after
// W_UV ends. Here every CTA copies its o_proj rows into shared memory (the TMA engine) before the
// PDL wait, while the attention's merge still runs; after the wait it computes its share of W_UV's
// outputs, the grid meets at one barrier (every output is needed by every o_proj row), and each CTA
// finishes its rows from shared memory.
//
// The grid barrier: at most one CTA an SM (the grid is at most the SM count) and the launch only
// where the driver's occupancy query holds the whole grid at once, so every CTA is resident while
// the others wait; a CTA arrives once (CTA 0 adds 2^31 - (ctas - 1), the others 1: the word's top
// bit flips when the last arrives and its low bits return to what they were, so no reset is needed
// between launches of any grid size). The barrier's word belongs to this kernel alone. Should the
// grid not be resident at once after all (other work holding SMs: another process under MPS,
// another backend on the GPU), a CTA that waited 200 µs (barrier_timeout_us) makes every per-head
// output itself, from global memory, with the same sums: slow, never stuck, the same bits.
//
// Bits: those of the two launches. An output of the per-head GEMV is per_head_gemv.cu's sum
// (`lanes` lanes, fmaf in k order, the xor butterfly) rounded to bf16 and stored where that launch
// stores it; a row of the linear is gemv_kernel's (linear.cu: `ks` parts of interleaved 256-value
// blocks, each lane's 8-value steps in k order, the xor butterfly, the parts added in order, the
// bias) over those bf16 values.
#pragma once

#include <cstddef>

#include "backend/cuda/launch.h"

namespace strata::cuda {

constexpr int kHeadGemvLinearMaxTokens = 2;

struct HeadGemvLinearParams {
  // The per-head GEMV: mid[t · k + h · n_head + r] = Σ_j x[t · ldx + h · stride_x + j] ·
  // w_head[(h · n_head + r) · k_head + j], k = heads · n_head.
  const bf16_bits* x;
  const bf16_bits* w_head;  // [heads · n_head, k_head]
  bf16_bits* mid;           // [tokens, k]: the per-head outputs, the linear's input
  // The linear: out[t · n + i] = Σ_j mid[t · k + j] · w[i · k + j] (+ bias[i]).
  const bf16_bits* w;  // [n, k]
  const float* bias;   // [n] or null
  bf16_bits* out;      // [tokens, n]
  unsigned* barrier;   // the grid barrier's word (CudaBackend::head_gemv_linear_barrier_)
  int64_t ldx, stride_x;
  int64_t n;
  int tokens, heads, n_head, k_head;
  int lanes;     // per-head GEMV lanes a row (per_head_gemv_set_lanes)
  int ks;        // the linear's warps a row in gemv_kernel (gemv_ksplit): its parts, 1, 2 or 4
  int ctas;      // the grid: CTA b takes rows [b · n / ctas, (b + 1) · n / ctas) of the linear
  int rows_max;  // and outputs [b · k / ctas, ..) of the per-head GEMV; the most of either a CTA
  int outs_max;  // takes (its shared memory)
  int pdl_early;
  int reserved_zero;  // keeps the struct free of padding (its bytes are a graph's signature)
  // How long a CTA waits at the grid barrier before making every per-head output itself (µs;
  // CudaTunables::head_gemv_linear_barrier_timeout_us; 0: the tests' way into that path).
  int barrier_timeout_us;
};
static_assert(sizeof(HeadGemvLinearParams) == 7 * 8 + 3 * 8 + 12 * 4,
              "HeadGemvLinearParams has no padding");

// Fills ctas, rows_max and outs_max from the other sizes in p.
void head_gemv_linear_set_grid(HeadGemvLinearParams& p);
// The dynamic shared memory the launch takes (after head_gemv_linear_set_grid).
size_t head_gemv_linear_smem_bytes(const HeadGemvLinearParams& p);
// Whether the GPU holds the whole grid at once (the driver's occupancy query and the opt-in
// shared-memory limit; false on an error).
bool head_gemv_linear_one_wave(const HeadGemvLinearParams& p);
void launch_head_gemv_linear(const HeadGemvLinearParams& p, const Launch& launch);

}  // namespace strata::cuda
