// W4A16 linears on the GPU: INT4 group-quantized weights (compressed-tensors `pack-quantized`,
// symmetric) times bf16 activations, float32 accumulation, bf16 out. The weights live on the
// device in a tiled layout made once at upload by launch_int4_repack (linear_int4.cu's design
// note has the layout and why); every other kernel here reads that layout.
//
//   launch_int4_repack        checkpoint layout -> device layout (once, at upload)
//   launch_int4_dequant_bf16  device layout -> bf16 [n, k] (fallback for very large m; tests)
//   launch_int4_gemv          m <= kInt4GemvMaxRows (decode): weights streamed once; three
//                             kernels: the register GEMV (m <= 8, linear_int4_reg.cu: weights
//                             straight into registers, x in shared memory, group scale in
//                             float32, the default), the mma GEMV (m <= 32, linear_int4.cu) and
//                             the stream GEMV (m <= 8, linear_int4_stream.cu: cp.async.bulk into
//                             shared memory; only when forced)
//   launch_int4_gemm          any m (prefill, large batches): wgmma, dequantized in registers
//   int4_use_gemv             the GEMV / GEMM crossover the backend dispatch follows
//
// Parameter blocks are trivially copyable and free of implicit padding (the backend records
// launches by their bytes, kernels.h); launchers are asynchronous, allocate nothing and never
// synchronize.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "backend/cuda/launch.h"
#include "backend/cuda/norm.h"

// The layout helpers below run on the host and in kernels.
#ifdef __CUDACC__
#define STRATA_INT4_HD __host__ __device__
#else
#define STRATA_INT4_HD
#endif

namespace strata::cuda {

// ---- the device layout (see linear_int4.cu) ----
constexpr int kInt4TileRows = 16;    // output rows per tile
constexpr int kInt4TileK = 64;       // input columns per tile
constexpr int kInt4TileBytes = 512;  // 16 x 64 nibbles: one 16-byte load per lane of a warp

STRATA_INT4_HD inline int64_t int4_row_tiles(int64_t n) {
  return (n + kInt4TileRows - 1) / kInt4TileRows;
}
STRATA_INT4_HD inline int64_t int4_k_tiles(int64_t k) { return (k + kInt4TileK - 1) / kInt4TileK; }
// Scale groups per row tile in the device layout: the k tiles' span (k rounded up to 64) in
// groups; equals k / group unless group is 32 and k is an odd multiple of 32.
STRATA_INT4_HD inline int64_t int4_scale_groups(int64_t k, int group) {
  return (int4_k_tiles(k) * kInt4TileK + group - 1) / group;
}
// Device bytes of a repacked [n, k] weight: the checkpoint's n·k/2 packed and n·(k/group)·2
// scale bytes whenever n % 16 == 0 and k % 64 == 0 (every real checkpoint shape); otherwise
// padded up to those multiples.
STRATA_INT4_HD inline int64_t int4_packed_bytes(int64_t n, int64_t k) {
  return int4_row_tiles(n) * int4_k_tiles(k) * kInt4TileBytes;
}
STRATA_INT4_HD inline int64_t int4_scale_bytes(int64_t n, int64_t k, int group) {
  return int4_row_tiles(n) * int4_scale_groups(k, group) * kInt4TileRows * 2;
}
// Group sizes the kernels take: powers of two from 32 (compressed-tensors' 32, 64 and 128, and
// larger); k must be a multiple of the group.
STRATA_INT4_HD inline bool int4_group_supported(int group) {
  return group >= 32 && group <= (1 << 20) && (group & (group - 1)) == 0;
}

struct Int4RepackParams {
  const int32_t* src_packed;   // checkpoint weight_packed [n, src_cols], src_cols >= ceil(k / 8)
  const bf16_bits* src_scale;  // checkpoint weight_scale [n, k / group]
  void* dst_packed;            // int4_packed_bytes(n, k)
  bf16_bits* dst_scale;        // int4_scale_bytes(n, k, group)
  int64_t n;
  int64_t k;
  int64_t src_cols;
  int group;
  int pad_;
};
void launch_int4_repack(const Int4RepackParams& p, cudaStream_t stream);

struct Int4DequantParams {  // out [n, k] bf16 = (nibble - 8) · scale, the product rounded to bf16
  const void* packed;       // device layout
  const bf16_bits* scale;   // device layout
  bf16_bits* out;
  int64_t n;
  int64_t k;
  int group;
  int pad_;
};
void launch_int4_dequant_bf16(const Int4DequantParams& p, cudaStream_t stream);

// out [m, n] = x [m, k] · Wᵀ (+ bias) with W [n, k] = (nibble - 8) · scale rounded to bf16 (as
// compressed-tensors and the CPU twin dequantize), float32 accumulation, bias added before the
// output's bf16 rounding. Except: the register and stream GEMVs with gemv_round = 0 (their
// default) use W unrounded, (nibble - 8) · scale exactly, the scale applied per group in float32
// (linear_int4_reg.cu: NMSE ~1.3e-6 against the rounded weights, below the output's own
// rounding); gemv_round = 1 (or the mma GEMV) gives the reference's bits. k % 32 == 0 (a multiple
// of the group); x, packed and scale 16-byte aligned (x rows then are too); packed and scale as
// launch_int4_repack wrote them. GEMV only: glu_inter > 0 makes W the fused gate-up projection [2 ·
// glu_inter, k] (gate rows, then up rows; glu_inter % 16 == 0) and out [m, glu_inter] = silu(g) · u
// with g, u the bf16-rounded rows j and glu_inter + j (bias included), as launch_silu_mul computes
// them.
constexpr int kInt4GemvMaxRows = 32;
struct Int4LinearParams {
  const bf16_bits* x;
  const void* packed;
  const bf16_bits* scale;
  const float* bias;  // [n] or null
  bf16_bits* out;
  int64_t m;
  int64_t n;
  int64_t k;
  int64_t glu_inter;  // GEMV: 0 plain, else the SwiGLU epilogue
  int group;
  // mma GEMV: warps per 16-row tile (0: the most, up to 8, whose grid fits gemv_blocks_per_sm
  // blocks per SM, default 2: what is resident at once; else 1, 2, 4 or 8).
  int gemv_ksplit;
  int gemv_blocks_per_sm;
  // GEMM: token tile (0: auto, 64 or 128); 1 = the two warpgroups of a block take different
  // output rows, 2 = the same rows and alternate k tiles, summed in shared memory (twice the
  // blocks, for small n · m); 0 = auto.
  int gemm_tokens;
  int gemm_ksplit;
  int pdl_early;  // trigger the next kernel before waiting on the previous (common.cuh)
  // GEMV: load the first weights before waiting on the previous kernel (weights are never
  // written by a kernel, so their stream may start while the predecessor finishes). Set it in
  // production (0 only for A/B measurements); it needs the weights not to be written by the
  // kernel just before.
  int preload;
  // GEMV kernel: 0 auto (int4_gemv_auto_kernel: the register GEMV where it fits, else the mma
  // GEMV), kInt4GemvStream, kInt4GemvMma or kInt4GemvReg.
  int gemv_kernel;
  // Register and stream GEMV knobs, 0 = default: warps per block (8; register 1..8, stream
  // 1..16), blocks (the SMs), gemv_round = 1: weights rounded to bf16 before the mma (the
  // reference's bits, ~15 more instructions per 8 weights). Stream only: ring stages per warp
  // (~64 KB of ring per block, fewer where x is large), tiles per stage (4; 4 or 8).
  int gemv_warps;
  int gemv_stages;
  int gemv_chunk;
  int gemv_grid;
  int gemv_round;
  // Register GEMV only, 0 = default: k tiles in flight per warp (its register ring: 16, or 8;
  // group 32: 8); when the next kernel may launch (kInt4TriggerEarly; see below); the most
  // blocks per SM its shared memory leaves room for, its successor's included (0: no padding,
  // the registers allow 2).
  int gemv_unroll;
  int gemv_trigger;
  int gemv_depth;
  // Register GEMV: row tiles a warp multiplies at each k tile, sharing its x fragments and the
  // position's bookkeeping (0 or 1: one; 4 where instantiated: ring 8, group <= 128; else one).
  int gemv_rows;
  // Register GEMV, dense: x (m · k · 2 bytes) up to this many bytes arrives in shared memory by
  // one bulk copy (TMA) issued right after the PDL wait, and is put in fragment order from there;
  // 0: every thread loads its pieces of x from global memory, behind the weight loads it issued
  // before the wait (~1.7 us a launch, 2026-12-05-session32.md).
  int gemv_x_tma;
  // Register GEMV, dense, m <= 2 (graph mode's merge of the rms_norm that made x:
  // int4_norm_fusion.cc): every block normalizes norm.x itself (norm_prologue.cuh's order of sums,
  // launch_rms_norm's bits) instead of reading x, and block 0 stores the normalized rows at x.
  // norm.x null: none.
  NormPrologue norm;
  // Register GEMV, plain: residual [m, n] += out, out rounded to bf16 first (add_rms_norm's
  // residual update and its bits: graph mode moves it here, int4_norm_fusion.cc). Null: none.
  bf16_bits* residual;
};
constexpr int kInt4GemvStream = 1;
constexpr int kInt4GemvMma = 2;
constexpr int kInt4GemvReg = 3;
// gemv_trigger: griddepcontrol.launch_dependents before the PDL wait (right after the weight
// preload), after it, or once a warp has issued its last weight loads.
constexpr int kInt4TriggerEarly = 1;
constexpr int kInt4TriggerAfterWait = 2;
constexpr int kInt4TriggerLate = 3;
static_assert(std::has_unique_object_representations_v<Int4RepackParams> &&
                  std::has_unique_object_representations_v<Int4DequantParams>,
              "no padding bytes: launches are recorded by their parameter bytes");
// (norm's eps is a float: no unique representation, so the sizes say it instead.)
static_assert(sizeof(NormPrologue) == 2 * 8 + 2 * 4 &&
                  sizeof(Int4LinearParams) == 9 * 8 + 18 * 4 + sizeof(NormPrologue) + 8,
              "no padding bytes: launches are recorded by their parameter bytes");
// Decode: m <= kInt4GemvMaxRows, plain or SwiGLU (the bench compares it with the GEMM up to m =
// 32).
void launch_int4_gemv(const Int4LinearParams& p, cudaStream_t stream);
// The graph recorder's form of it (the recorder hands launchers a Launch): linear_packed.cc and
// int4_norm_fusion.cc record it.
inline void run_int4_gemv(const Int4LinearParams& p, const Launch& l) {
  launch_int4_gemv(p, l.stream);
}
// Whether launch_int4_gemv can run p (its knobs included) on the stream GEMV / the register
// GEMV: m <= 8, group <= 256, and their shared memory (x is m·k·2 bytes of it) within 227 KB.
bool int4_gemv_stream_fits(const Int4LinearParams& p);
// The row tiles a position the register GEMV would run p with (gemv_rows where instantiated,
// else 1); 0 where it cannot take p.
int int4_gemv_reg_rows(const Int4LinearParams& p);
// Whether the register GEMV would stage p's x by one bulk copy (gemv_x_tma, dense, x small
// enough and 16-byte aligned).
bool int4_gemv_reg_x_tma(const Int4LinearParams& p);
// Experts modes of the register GEMV (the MoE decode path, moe_experts.cu): `packed` / `scale`
// hold a stack of experts' [n, k] matrices (each n rows, the linear_int4 layout of the whole
// [E · n, k] stack); SwiGLU with glu_inter; no bias; an expert id outside [0, num_experts)
// leaves its rows unwritten. Two ways to give the work:
//   by ids (ids set, m = 1): assignment i = t · top_k + j multiplies x row i / x_div by expert
//     ids[i] into out row i. Every touched expert's bytes are read once per assignment: for
//     T · k small against the experts (a repeated expert is read again).
//   planned (tiles set, m = the plan's tile rows, <= 8): a MoePlan made with m-row tiles
//     (moe_experts.h): tile q is (expert e, first permuted row r0), its rows r0 .. min(r0 + m,
//     offsets[e + 1]) - 1 read x row row_token[r] (or r where row_token is null) and write out
//     row r; tiles past counts[1] do nothing. Each expert's bytes are read once per m rows.
struct Int4RegExperts {
  const int32_t* ids;  // by ids: [assignments] (topk_ids)
  int64_t assignments;
  int x_div;  // by ids: gate_up top_k (x row = token), down 1 (x row = assignment)
  int num_experts;
  int ids_early;  // the ids / plan are complete before this kernel starts (read before its
                  // pdl_wait, so the weights may preload then): the predecessor triggered
                  // after its own wait
  int min_split;  // at least this many blocks per work item (0: two blocks per SM over them)
  int max_units;  // at most this many row tiles (SwiGLU: pairs) a block (0: the kernel's 32)
  int pad_;
  const int32_t* tiles;      // planned: MoePlan::tiles of m-row tiles
  const int32_t* counts;     // planned: MoePlan::counts ([1]: tiles in use)
  const int32_t* offsets;    // planned: MoePlan::offsets
  const int32_t* row_token;  // planned: x row of permuted row r; null: r
  int64_t max_tiles;         // planned: the grid's bound (moe_max_tiles(T·k, E, m))
};
bool int4_gemv_reg_fits(const Int4LinearParams& p, const Int4RegExperts* experts = nullptr);
// The kernel launch_int4_gemv runs for p: gemv_kernel where set, else kInt4GemvReg where it
// fits, else kInt4GemvMma.
int int4_gemv_auto_kernel(const Int4LinearParams& p);
// The backend's choice for an INT4 linear of m rows: the GEMV (true) or the GEMM. Measured on
// the 8B shapes (2026-12-01, H200): the GEMM is ahead from m = 16 on every shape, the mma GEMV
// up to m = 8 (but gate_up at m = 8, within 5%).
// bench/cuda/int4_linear_bench.cc's crossover table (m = 1..32) re-measures it.
inline bool int4_use_gemv(int64_t m, int64_t /*n*/, int64_t /*k*/) { return m <= 8; }
// Any m, plain only (glu_inter must be 0). Sets its kernels' shared-memory limit on first use on
// each device; init_int4_linear_kernels() does it for the current device ahead (before a
// CUDA-graph capture).
void launch_int4_gemm(const Int4LinearParams& p, cudaStream_t stream);
void init_int4_linear_kernels();

}  // namespace strata::cuda
