// Linears with DeepSeek-V3 FP8-block weights on the GPU (design note: linear_fp8.cu).
//
// Weight format: `w` e4m3 [n, k] row-major (k bytes per row) and `scale` float32
// [ceil(n/128), scale_ld] with scale_ld >= ceil(k/128) (the checkpoint's `weight_scale_inv`,
// scale_ld = ceil(k/128)); weight (r, c) = w[r, c] · scale[r / 128, c / 128]. Activations and
// outputs bf16, float32 accumulation, optional float32 bias [n].
//
// Paths (all launchers are asynchronous on `stream`, take trivially copyable parameters, never
// allocate or synchronize; scratch and plans come from the caller):
//   launch_fp8_gemv        decode, m <= kFp8GemvMaxRows: W8A16 (bf16 activations, weights
//                          dequantized in registers), optional SwiGLU epilogue, batched for MoE.
//   launch_fp8_act_quant   activations -> e4m3 per token per 128-wide k group (DeepSeek's
//                          act_quant: scale = amax / 448, q = e4m3(x / scale)).
//   launch_fp8_gemm        W8A8 on the FP8 tensor cores through cuBLASLt block scaling
//                          (weights 128x128 blocks, activations 1x128 groups).
//   launch_fp8_linear      prefill: act_quant + gemm on the first m & ~3 rows, the GEMV on the
//                          last m % 4 rows (cuBLASLt's block-scaled modes need m % 4 == 0).
//   launch_fp8_dequant     weights -> bf16 [n, k] (fallback for shapes the GEMM refuses; test
//                          reference), bit for bit model/quant.h's dequant_fp8_block.
//   launch_fp8_repack_scales  copies a scale table to another row stride (the GEMM needs
//                          scale_ld = fp8_gemm_scale_ld(k), a multiple of 4).
// Choosing (the dispatch's rule): m up to the GEMV/GEMM crossover that fp8_linear_bench measures
// (the GEMV is memory bound at m = 1-2, CUDA-core bound beyond) -> launch_fp8_gemv; above, if
// fp8_gemm_shape_ok(4, n, k) and try_plan finds an algorithm -> launch_fp8_linear; otherwise
// dequantize (once at load, or into scratch) and run the bf16 linear.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>

#include "backend/cuda/launch.h"

namespace strata::cuda {

constexpr int kFp8Block = 128;       // block edge of the weight scales and activation groups
constexpr int kFp8GemvMaxRows = 16;  // rows (tokens) one GEMV launch takes

// Scale columns of a k-wide FP8-block matrix, and the row stride the GEMM needs for them.
inline int64_t fp8_scale_cols(int64_t k) { return (k + kFp8Block - 1) / kFp8Block; }
inline int64_t fp8_gemm_scale_ld(int64_t k) { return (fp8_scale_cols(k) + 3) / 4 * 4; }

// A weight as the kernels address it. MoE: experts stacked in one allocation are addressed by
// base pointer + expert index · stride (Fp8GemvParams::batch_ids, and issue 23's grouped GEMM).
struct Fp8Weight {
  const uint8_t* w;    // [n, k] e4m3; k % 16 == 0, 16-byte aligned
  const float* scale;  // [ceil(n/128), scale_ld]
  int64_t n;
  int64_t k;
  int64_t scale_ld;      // floats between scale rows
  int64_t w_stride;      // bytes between consecutive experts' w (0: one matrix)
  int64_t scale_stride;  // floats between consecutive experts' scale tables
};

// ---- decode GEMV (W8A16) ----
// out [m, n] = x [m, k] · dequant(w)ᵀ (+ bias). With glu_inter > 0 the weight is a fused
// gate-up projection [2 · glu_inter, k] (gate rows, then up rows) and out is [m, glu_inter]:
// silu(g) · u with g and u rounded to bf16 first, as a GEMV into bf16 followed by silu_mul would.
// Its scale table is the gate's [ceil(inter/128), ld] followed by the up's (the two checkpoint
// tables stacked; the same as one table of the fused matrix when inter % 128 == 0, which the
// GEMM path, blind to the seam, needs for a fused gate-up weight).
// Batched (MoE decode): batch b (grid.y, `batches` of them) reads x + b · x_batch_stride, writes
// out + b · out_batch_stride and uses expert batch_ids[b] (device int32; null: expert b) of w.
struct Fp8GemvParams {
  const bf16_bits* x;  // [m, k] per batch
  Fp8Weight w;
  const float* bias;  // [n] (GLU: [2 · glu_inter]) or null; shared by all experts
  bf16_bits* out;     // [m, n] or [m, glu_inter] per batch
  const int32_t* batch_ids;
  int64_t x_batch_stride;    // elements
  int64_t out_batch_stride;  // elements
  int64_t glu_inter;         // 0: plain GEMV
  int m;                     // 1..kFp8GemvMaxRows
  int batches;               // >= 1
  int ksplit;                // warps per weight row: 0 = automatic, else 1, 2, 4 or 8 (GLU <= 4)
  int pdl_early;             // trigger the next kernel before waiting on the previous
};
void launch_fp8_gemv(const Fp8GemvParams& p, cudaStream_t stream);
// Warps per weight row the automatic choice takes (benchmarks print it).
int fp8_gemv_auto_ksplit(int64_t rows, int64_t k, bool glu);

// ---- activation quantization ----
// q [m, k] e4m3 (k bytes per row); scale[g · scale_ld + r] = amax(x[r, 128g : 128g + 128]) / 448
// for r < m (token-contiguous per group: the layout cuBLASLt's VEC128_32F wants for the GEMM's
// activation operand, scale_ld = the GEMM's m). q = e4m3(x / scale), rounded to nearest even and
// saturated at ±448; a group of zeros gets scale 1 (DeepSeek's kernel would divide 0 by 0).
struct Fp8ActQuantParams {
  const bf16_bits* x;  // [m, k], row stride k
  uint8_t* q;          // [m, k]
  float* scale;        // [ceil(k/128), scale_ld]
  int64_t m;
  int64_t k;         // k % 16 == 0
  int64_t scale_ld;  // >= m
};
void launch_fp8_act_quant(const Fp8ActQuantParams& p, cudaStream_t stream);

// ---- prefill GEMM (W8A8, cuBLASLt) ----
// A plan: the matmul descriptor, layouts and heuristic algorithm of one (m, n, k), built once by
// Fp8GemmPlanner (host work, allocation) and reused by every launch of that shape.
struct Fp8GemmPlan;
// Whether the GEMM takes an [m rows] x [n, k] problem at all (cuBLASLt's FP8 rules: 16-byte
// rows and leading dimensions, block-scaled modes need m and n multiples of 4). m = 0 is fine.
bool fp8_gemm_shape_ok(int64_t m, int64_t n, int64_t k, std::string* why);

class Fp8GemmPlanner {
 public:
  // `workspace` (device, `workspace_bytes`, 32 MiB recommended on Hopper) is shared by every
  // matmul of this planner: launches must be serialized on one stream (or one at a time).
  Fp8GemmPlanner(void* workspace, size_t workspace_bytes);
  ~Fp8GemmPlanner();
  Fp8GemmPlanner(const Fp8GemmPlanner&) = delete;
  Fp8GemmPlanner& operator=(const Fp8GemmPlanner&) = delete;

  // The cached plan of (m, n, k), created on first use. try_plan returns null and says why when
  // the shape is refused (fp8_gemm_shape_ok) or cuBLASLt has no algorithm for it; plan CHECKs.
  Fp8GemmPlan* try_plan(int64_t m, int64_t n, int64_t k, std::string* why);
  Fp8GemmPlan* plan(int64_t m, int64_t n, int64_t k);
  size_t size() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};
// "cuBLASLt algo 66 tile 128x128 stages 4 splitK 1 ws 0 B" (the tests and benchmarks print it).
std::string describe(const Fp8GemmPlan& plan);

// out [m, n] = dequant(xq, x_scale) · dequant(w)ᵀ (+ bias), m % 4 == 0, plan = plan(m, n, k);
// w.scale_ld must be fp8_gemm_scale_ld(k) and x_scale's row stride m.
struct Fp8GemmParams {
  Fp8GemmPlan* plan;
  const uint8_t* xq;     // [m, k] e4m3
  const float* x_scale;  // [ceil(k/128), m]
  Fp8Weight w;           // one matrix (w_stride unused)
  const float* bias;     // [n] or null (added by a second kernel: bias_add)
  bf16_bits* out;        // [m, n]
  int64_t m;
};
void launch_fp8_gemm(const Fp8GemmParams& p, cudaStream_t stream);

// The prefill linear for any m: rows [0, m & ~3) through act_quant + gemm (plan = plan(m & ~3,
// n, k); null when m < 4), the remaining m % 4 rows through the GEMV. Scratch: xq >= m · k bytes,
// x_scale >= ceil(k/128) · m floats.
struct Fp8LinearParams {
  Fp8GemmPlan* plan;
  const bf16_bits* x;  // [m, k]
  Fp8Weight w;
  const float* bias;  // [n] or null
  bf16_bits* out;     // [m, n]
  uint8_t* xq;
  float* x_scale;
  int64_t m;
};
void launch_fp8_linear(const Fp8LinearParams& p, cudaStream_t stream);
inline int64_t fp8_gemm_rows(int64_t m) { return m & ~int64_t(3); }

// ---- conversions ----
struct Fp8DequantParams {  // out [n, k] bf16 = round_bf16(float(w) · scale)
  Fp8Weight w;
  bf16_bits* out;
};
void launch_fp8_dequant(const Fp8DequantParams& p, cudaStream_t stream);

struct Fp8RepackScalesParams {  // dst[r, c] = src[r, c] for c < cols, 0 for cols <= c < dst_ld
  const float* src;
  float* dst;
  int64_t rows;
  int64_t cols;
  int64_t src_ld;
  int64_t dst_ld;
};
void launch_fp8_repack_scales(const Fp8RepackScalesParams& p, cudaStream_t stream);

// The backend records launches by their parameter bytes (graph signatures).
static_assert(std::is_trivially_copyable_v<Fp8GemvParams>);
static_assert(std::is_trivially_copyable_v<Fp8ActQuantParams>);
static_assert(std::is_trivially_copyable_v<Fp8GemmParams>);
static_assert(std::is_trivially_copyable_v<Fp8LinearParams>);
static_assert(std::is_trivially_copyable_v<Fp8DequantParams>);
static_assert(std::is_trivially_copyable_v<Fp8RepackScalesParams>);

}  // namespace strata::cuda
