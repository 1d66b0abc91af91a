// Mixture-of-experts expert compute on the GPU (issue 23): the routed experts' SwiGLU MLPs for
// the tokens' top-k choices, with no host synchronization, in bf16, FP8-block (DeepSeek-V3) and
// W4A16 (INT4 group 32 / 128, compressed-tensors), in two regimes. Design: moe_experts.cu;
// device pieces: moe_experts.cuh.
//
// One step: launch_moe_experts (the backend's entry point; each piece is also callable alone):
//   decode   gate_up GEMV -> down GEMV -> combine, three launches (FP8 with fp8_f16: each GEMV
//            after its x's f16 stage, five, unless the GEMV stages x itself in shared memory:
//            fp8_f16_smem_max_tokens). The GEMV kernels find their expert and its rows
//            from topk_ids themselves (no plan kernel); rows stay in assignment order
//            i = t·k + j: act [T·k, inter] and y [T·k, hidden] rows are i.
//   prefill  plan -> gate_up GEMM -> down GEMM -> combine. The plan puts the rows in expert
//            order (expert e's rows are [offsets[e], offsets[e + 1])); act and y rows are in
//            that permuted order and `pos` maps each assignment to its row.
// The pieces:
//   launch_moe_plan   topk_ids -> per-expert row counts and offsets, each assignment's permuted
//                     row `pos`, each permuted row's token, the list of experts with rows and the
//                     tile list of the prefill GEMM. One CTA up to kMoePlanOneCtaMax assignments,
//                     else three kernels over chunks; atomics for slots (outputs are bit for bit
//                     deterministic all the same: see moe_experts.cu).
//   gate_up           act = silu(x·Wgᵀ) ⊙ (x·Wuᵀ), x read through the rows' tokens (no gathered
//                     copy of x)
//   down              y = act · Wdᵀ
//   launch_moe_combine  out[t] = Σ_j w[t, j] · y[row(t, j)] (+ add[t]), experts summed in
//                     ascending id order as the CPU twin does; `add` fuses the shared experts.
// Regimes (the caller's choice is by host-known sizes only, never by device counts):
//   launch_moe_gemv   decode: few tokens per expert. Batched GEMV over the touched experts:
//                     every touched expert's weight bytes are read once per pass of up to 32
//                     rows (mma.sync, 16 weight rows x 8 rows per tile), k split over warps and
//                     over the CTAs of a cluster so that one token's experts fill every SM;
//                     int4 gate_up (and int4 at > 8 rows) through a per-warp cp.async ring in
//                     dynamic shared memory (init_moe_gemv_kernels sets its limit).
//   launch_moe_gemm   prefill: wgmma tiles per expert segment (64 weight rows per warpgroup x
//                     64 or 128 of the expert's rows), weights dequantized in registers.
//
// Weights (all formats): each expert's [n, k] matrix in 512-byte tiles of 16 rows, ordered
// [row tile][k tile], experts one after the other (n % 16 == 0). A lane's 16 bytes of a tile are
// its mma.m16n8k16 A fragments (moe_experts.cuh has the exact byte order):
//   int4  16 x 64 tiles: linear_int4's device layout (launch_int4_repack on the whole stack as one
//         [E · n, k] matrix: the same bytes as the checkpoint when k % 64 == 0) and its scales.
//   fp8   16 x 32 tiles made by launch_moe_repack; scales are the checkpoint's float32 tables
//         [ceil(n / 128), ceil(k / 128)] per expert, unchanged (gate_up: inter % 128 == 0, which
//         concat_linear_rows already demands of fp8 gate/up parts).
//   bf16  16 x 16 tiles made by launch_moe_repack.
// Device bytes: moe_values_bytes / moe_scale_bytes, equal to linear_weight_bytes whenever
// k % 64 (int4), k % 32 (fp8), k % 16 (bf16) is 0: every real checkpoint shape.
// Numerics: dequantized weights are bit for bit the CPU twin's (int4: (nibble - 8) · scale
// rounded to bf16; fp8: value · scale in float32 rounded to bf16); float32 accumulation; gate and
// up rounded to bf16 before silu (as linear + silu_mul), act, y and out stored in bf16. FP8
// decode with x staged in f16 (fp8_f16) keeps w · s unrounded instead: e4m3 values times f16 x
// summed in float32 per 128-column block, times the block scale (moe_stage_f16.cu); so does INT4
// decode's gate_up on the register GEMV (planned, above moe_int4_reg_max_assignments): (128 +
// nibble) into the mma, −136·Σx and the scale on float32 group sums (int4_gate_up_round 0).
//
// Parameter blocks are trivially copyable without padding bytes (the backend records launches by
// their bytes for CUDA graphs); launchers are asynchronous on `stream`, never allocate, never
// synchronize; scratch comes from the caller with its size formula here.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/launch.h"

namespace strata::cuda {

enum MoeWeightFormat : int { kMoeBf16 = 0, kMoeFp8 = 1, kMoeInt4 = 2 };

constexpr int kMoeTileRows = 16;
constexpr int kMoeTileBytes = 512;
constexpr int kMoeFp8Block = 128;     // FP8 scale block edge
constexpr int kMoeMaxExperts = 1024;  // the plan kernel's one block
constexpr int kMoeMaxTopK = 32;

// Columns of one 512-byte tile.
constexpr int moe_tile_k(int format) {
  return format == kMoeInt4 ? 64 : format == kMoeFp8 ? 32 : 16;
}
constexpr int64_t moe_k_tiles(int format, int64_t k) {
  return (k + moe_tile_k(format) - 1) / moe_tile_k(format);
}
// Bytes of one expert's [n, k] matrix (n % 16 == 0).
int64_t moe_values_bytes(int format, int64_t n, int64_t k);
int64_t moe_scale_bytes(int format, int64_t n, int64_t k, int group);
// Whether the kernels take an [n, k] expert matrix of this format (why not, into *why).
bool moe_weight_shape_ok(int format, int64_t n, int64_t k, int group, const char** why);

// One projection of every expert: expert e's tiles at values + e · values_stride (bytes), its
// scales at scales + e · scales_stride (bytes).
struct MoeWeights {
  const void* values;
  const void* scales;  // int4: bf16 (linear_int4 layout); fp8: float32 tables; bf16: null
  int64_t values_stride;
  int64_t scales_stride;
  int64_t n;
  int64_t k;
  int format;  // MoeWeightFormat
  int group;   // int4 group size (32, 64, 128, ...); else 0
};

// Row-major [rows, k] bf16 (format kMoeBf16) or e4m3 bytes (kMoeFp8) -> the tile layout above;
// rows = experts · n, rows % 16 == 0, k % 16 == 0. Columns past k in the last tile are zero.
// unpack = 1: the inverse, tiles -> row-major (the CPU twin's dequantization of tiled experts).
struct MoeRepackParams {
  const void* src;
  void* dst;  // moe_values_bytes(format, rows, k); unpack: rows · k elements
  int64_t rows;
  int64_t k;
  int format;
  int unpack;
};
void launch_moe_repack(const MoeRepackParams& p, cudaStream_t stream);

// ---- the plan (prefill) ----
// Device arrays the plan kernels write (T·k = assignments, E = experts):
struct MoePlan {
  int32_t* offsets;       // [E + 1]
  int32_t* pos;           // [T·k]: permuted row of assignment (t, j), -1 for an id outside [0, E)
  int32_t* row_token;     // [T·k]: token of each permuted row (rows past offsets[E] unused)
  int32_t* active;        // [E]: experts with rows, ascending
  int32_t* counts;        // [2]: number of active experts, number of GEMM tiles
  int32_t* tiles;         // [2 · max_tiles]: (expert, first permuted row) of each GEMM tile
  int32_t* block_counts;  // [moe_plan_blocks(T·k) · E] scratch of the multi-CTA plan, or null
                          // when moe_plan_blocks(T·k) == 0
};
// Up to kMoePlanOneCtaMax assignments the plan is one CTA; above, chunks of kMoePlanChunk per CTA.
constexpr int64_t kMoePlanOneCtaMax = 8192;
constexpr int kMoePlanChunk = 2048;
inline int64_t moe_plan_blocks(int64_t assignments) {
  return assignments > kMoePlanOneCtaMax ? (assignments + kMoePlanChunk - 1) / kMoePlanChunk : 0;
}
// Tiles of tile_rows rows the GEMM may need for `assignments` rows over `experts` experts.
inline int64_t moe_max_tiles(int64_t assignments, int experts, int tile_rows) {
  const int64_t touched = assignments < experts ? assignments : experts;
  return (assignments + tile_rows - 1) / tile_rows + touched;
}
struct MoePlanParams {
  const int32_t* topk_ids;  // [T·k]
  MoePlan plan;
  int64_t assignments;  // T·k
  int top_k;
  int num_experts;  // <= kMoeMaxExperts
  int tile_rows;    // rows per GEMM tile (64, 128 or 256); 0: no tile list
  int pdl_early;    // trigger the next kernel before waiting on the previous (common.cuh)
};
void launch_moe_plan(const MoePlanParams& p, cudaStream_t stream);

// ---- grouped expert GEMMs ----
// GEMV (decode), grouped mode (topk_ids set): slot a of the grid takes the a-th pass (of
// gemv_tokens rows) over the touched experts in ascending id; an expert's rows are the
// assignments i with topk_ids[i] == e, ascending: x row i / x_div, output row i. GEMM (prefill),
// grouped mode (offsets set): expert e's rows r in [offsets[e], offsets[e + 1]) read x row
// row_token ? row_token[r] : r and write out row r. Each row's x has k values and its output n
// values (or glu_inter with the SwiGLU epilogue). Dense mode (neither set): one expert (index 0),
// rows [0, rows) (a shared expert stored in the tile layout).
struct MoeGroupedParams {
  const bf16_bits* x;
  // GEMV, fp8 weights: or null. x staged in f16 (launch_moe_stage_f16: x16 [rows, k] = x · 2^e
  // per row, inv [rows] = 2^-e): the f16 kernels (e4m3 -> f16 exactly, one cvt a pair, the block
  // scale on each tile's float32 sums, 1 / 2^e on the outputs) read these instead of x.
  const uint16_t* x_f16;
  const float* x_inv;
  const int32_t* topk_ids;   // GEMV grouped: [assignments]
  const int32_t* row_token;  // GEMM: null: x row = permuted row
  const int32_t* offsets;    // GEMM grouped: MoePlan::offsets
  const int32_t* tiles;      // GEMM: MoePlan::tiles
  const int32_t* counts;     // GEMM: MoePlan::counts
  bf16_bits* out;
  MoeWeights w;
  int64_t rows;         // x's rows (every x row index is below it); dense mode: the rows computed
  int64_t glu_inter;    // > 0: w is gate_up [2 · glu_inter, k] (gate rows, then up rows) and
                        // out [rows, glu_inter] = silu(bf16(g)) · bf16(u); glu_inter % 16 == 0
  int64_t assignments;  // GEMV grouped: T·k
  int x_div;            // GEMV grouped: x row of assignment i is i / x_div (gate_up: k; down: 1)
  int num_experts;      // GEMV grouped: ids outside [0, num_experts) have no expert
  int max_active;       // GEMV grid bound: min(E, T·k) (grouped; the grid adds T·k / pass rows)
  int expect_active;    // GEMV grouped: the touched experts expected (shape choice); 0: max_active
  int max_tiles;        // GEMM grid bound: moe_max_tiles(T·k, E, tile_rows) (grouped)
  int tile_rows;        // GEMM rows per tile: 64 or 128 (grouped: the plan's tile_rows)
  int gemv_tokens;      // GEMV rows per weight pass: 8, 16 or 32 (more rows: more passes)
  int ksplit;           // GEMV warps of a CTA per row tile: 0 (auto), 1, 2, 4, 8
  int cluster;          // GEMV CTAs of a cluster splitting k further: 0 (auto), 1, 2, 4, 8 (> 1
                        // needs ksplit 8)
  int tiles_per_warp;   // GEMV row tiles a warp streams in turn: 0 (auto), 1, 2, 4, 8 (> 1 needs
                        // ksplit 1, cluster 1 and a plain projection)
  int gemm_blocks;      // GEMM, plain, k <= kMoeGemmShortK: 128-row weight blocks a CTA streams
                        // against its x tile held in shared memory; 0 auto (moe_gemm_blocks);
                        // < 0: the one-block pipeline instead (A/B measurements)
  int stage_smem;       // GEMV, fp8, x_f16 null: kMoeStagePass / kMoeStageAll, the f16 kernel
                        // stages x itself into shared memory (moe_gemv_stage_smem); else none
  int pdl_early;        // trigger the next kernel before waiting on the previous (common.cuh)
  int early_plan;       // GEMV grouped: topk_ids are complete before this kernel starts (its
                        // predecessor triggers only after its own wait, and that predecessor's
                        // predecessor wrote them): plan and first weights before pdl_wait
  int weight_stationary;  // GEMM, where moe_gemm_ws_supported: 1 the weight-stationary kernel
                          // (below), 0 the x-resident path or the one-block pipeline
  int pipe;               // GEMM, where moe_gemm_pipe_supported (and not weight-stationary): 1 the
                          // producer-warp kernel (below; the prefill default)
  int narrow_tails;       // GEMM, the weight-stationary kernel: an expert's last x tile of <= 32
                          // rows at wgmma n = 32, not 64 (fp8 and int4 at k = 256)
  int unused;             // (keeps the struct free of padding bytes: the asserts at the end)
};
// The GEMV's work decomposition for these parameters (auto fields chosen by a cost model, or for
// the int4 ring kernels with nothing forced by a rule fitted to measurements; forced ones kept;
// moe_experts_gemv.cu); {0, 0, 0} when the forced fields fit no shape (a k
// split of more warps than the k has batches, a cluster without ksplit 8, ...).
struct MoeGemvShape {
  int ksplit, cluster, tiles_per_warp;
};
MoeGemvShape moe_gemv_shape(const MoeGroupedParams& p);
void launch_moe_gemv(const MoeGroupedParams& p, cudaStream_t stream);
// Sets the int4 GEMV kernels' shared-memory limit (their ring) on the current device;
// launch_moe_gemv does it on first use per device, init_moe_gemm_kernels calls it too.
void init_moe_gemv_kernels();
// GEMM: plain projections with k <= kMoeGemmShortK (the down projection of a tp-8 expert slice,
// k = 256: four 64-column k steps) keep the CTA's x tile (64 rows) in shared memory for all of
// k and stream gemm_blocks 128-row weight blocks against it, so the pipeline neither refills x
// nor drains between blocks (with one block, a CTA's four k steps were mostly pipeline fill).
// int4 and fp8 (bf16's weight stages do not fit beside x at two CTAs per SM).
constexpr int64_t kMoeGemmShortK = 256;
// The blocks per CTA launch_moe_gemm takes for gemm_blocks = 0.
int moe_gemm_blocks(const MoeGroupedParams& p);
// Sets the GEMM kernels' shared-memory limit on the current device (launch_moe_gemm does it on
// first use; call ahead of a CUDA-graph capture).
void init_moe_gemm_kernels();
void launch_moe_gemm(const MoeGroupedParams& p, cudaStream_t stream);
// GEMM, grouped (offsets and num_experts set), plain projections of k = 128 or 256 with x in the
// plan's row order (row_token null: the down projection of a tp-8 expert slice, which reads
// act): one CTA per (expert, 128 weight rows) dequantizes its block once, into wgmma's A
// fragments kept in registers, and runs it against all of the expert's rows
// (moe_experts_gemm_ws.cu; launch_moe_gemm takes it where p.weight_stationary is set).
bool moe_gemm_ws_supported(const MoeGroupedParams& p);
void init_moe_gemm_ws_kernels();
void launch_moe_gemm_ws(const MoeGroupedParams& p, cudaStream_t stream);
// GEMM with producer warps (moe_experts_gemm_pipe.cu): one CTA an SM, two consumer
// warpgroups over 128 x rows and 256 weight rows, an mbarrier pipeline fed by a producer
// warpgroup's bulk copies (weights) and cp.async (x rows, scales); the same bits as the two-CTA
// kernel. Needs k % 64 == 0 and plan tiles of 128 rows (or dense mode); launch_moe_gemm takes it
// where p.pipe is set.
bool moe_gemm_pipe_supported(const MoeGroupedParams& p);
void init_moe_gemm_pipe_kernels();
void launch_moe_gemm_pipe(const MoeGroupedParams& p, cudaStream_t stream);

// ---- x in f16 for the FP8 GEMV (moe_stage_f16.cu says why it loses nothing) ----
// x16 holds each row in the fp8 tiles' fragment order: the 32 columns at 32t are stored at 32t
// as 4 pieces of 8, piece c = columns 2c, 2c+1, 2c+8, 2c+9, 16+2c, 17+2c, 24+2c, 25+2c (mma
// lane column c's B fragments of the tile's two k16 steps).
struct MoeStageF16Params {
  const bf16_bits* x;  // [rows, k]
  uint16_t* x16;       // [rows, k]: f16 bits of x · 2^e(row), in fragment order
  float* inv;          // [rows]: 2^-e(row), e putting the row's largest |x| in [2^14, 2^15)
  int64_t rows;
  int64_t k;  // % 32 == 0
  int pdl_early;
  int pad_;
};
void launch_moe_stage_f16(const MoeStageF16Params& p, cudaStream_t stream);
// launch_moe_experts stages x in f16 (MoeExpertsParams::fp8_f16) up to this many tokens: its
// scratch holds the staged rows only there (decode's sizes; above, FP8 runs the bf16-x GEMV, as
// it does for a projection whose k is not a multiple of 32).
constexpr int64_t kMoeStageF16MaxTokens = 1024;
// Or the f16 GEMV stages x itself, each CTA the rows it reads, into shared memory (no launch
// before it; MoeGroupedParams::stage_smem): the rows of its pass (kMoeStagePass: 8 · NT slots,
// NT the GEMV's n-tiles) or every row of x (kMoeStageAll: `rows` slots, fewer where x is one
// token), where slots · k <= kMoeStageSmemElems (16 KB of f16). A DeepSeek-V3 rank's down
// projection (k = 256) at every decode size, its gate_up (k = 7,168) at one token.
enum MoeStageSmem : int { kMoeStageNone = 0, kMoeStagePass = 1, kMoeStageAll = 2 };
constexpr int64_t kMoeStageSmemElems = 8192;
// The stage_smem mode for p (fp8 weights, x_f16 null, k % 32 == 0), kMoeStageNone where none fits.
int moe_gemv_stage_smem(const MoeGroupedParams& p);

// ---- combine ----
struct MoeCombineParams {
  const bf16_bits* y;         // [T·k, hidden]: rows in assignment order (pos null) or permuted
  const int32_t* pos;         // MoePlan::pos (prefill), or null: y row of (t, j) is t·k + j
  const int32_t* topk_ids;    // [T, k]; ids outside [0, num_experts) contribute nothing
  const float* topk_weights;  // [T, k]
  const bf16_bits* add;       // [T, hidden] or null: added before the output's rounding
  bf16_bits* out;             // [T, hidden]
  int64_t tokens;
  int64_t hidden;  // % 8 == 0
  int top_k;
  int num_experts;
  int pdl_early;
  // With the norm, up to this many tokens: a token's row split over a cluster of CTAs
  // (moe_combine.cu; CudaTunables::moe_combine_cluster_max_tokens).
  int cluster_max_tokens;
  // Or null: then the next layer's add_rms_norm(out, norm_residual, norm_w, norm_eps, norm_out)
  // in the same kernel, with its bits (moe_combine.cu; hidden <= 8,192, 16-byte aligned rows):
  // norm_residual = bf16(out + norm_residual), norm_out = its RMSNorm. norm_w: bf16, or f32 with
  // norm_w_f32.
  bf16_bits* norm_out;
  bf16_bits* norm_residual;
  const void* norm_w;
  float norm_eps;
  int norm_w_f32;
};
void launch_moe_combine(const MoeCombineParams& p, cudaStream_t stream);

// ---- the whole step ----
enum MoeRegime : int { kMoeAuto = 0, kMoeDecode = 1, kMoePrefill = 2 };
// The regime kMoeAuto picks: decode while the tokens per expert (T·k / E) stay at or below
// kMoeDecodeRowsPerExpert (the bench prints both regimes at every size to place this).
constexpr int kMoeDecodeRowsPerExpert = 8;
int moe_pick_regime(int64_t tokens, int top_k, int num_experts);
// Prefill tile rows for these sizes: 64, or 128 when experts average >= 64 rows (gate_up then
// dequantizes each weight once per 128 rows; moe_experts.cu has the measurements).
int moe_gemm_tile_rows(int64_t tokens, int top_k, int num_experts);
// Decode rows per weight pass (MoeGroupedParams::gemv_tokens): 8 while experts average <= 2
// rows (T·k <= 2E), 16 up to 4, else 32 (never more than T). More rows than that in one expert
// (a skewed batch) cost another pass over its weights, in parallel with the others (one grid
// slot a pass), never correctness.
int moe_gemv_tokens(int64_t tokens, int top_k, int num_experts);

struct MoeExpertsParams {
  const bf16_bits* x;         // [T, hidden]
  const int32_t* topk_ids;    // [T, k]
  const float* topk_weights;  // [T, k]
  const bf16_bits* add;       // [T, hidden] or null (the shared experts' output)
  bf16_bits* out;             // [T, hidden]; may alias add
  void* scratch;              // moe_experts_scratch_bytes(...), 256-byte aligned
  MoeWeights gate_up;         // n = 2 · inter, k = hidden
  MoeWeights down;            // n = hidden, k = inter
  int64_t tokens;
  int top_k;
  int num_experts;
  int regime;  // MoeRegime
  int pdl_early;
  int fixed_tiles;  // GEMM: 64-row plan tiles and the one-block pipeline whatever T (batch-
                    // invariant mode: the shapes never change with the batch)
  int int4_reg_max_assignments;  // decode, INT4: up to this many T · k the register GEMV's
                                 // experts mode by ids (linear_int4.h) instead of the grouped
                                 // GEMV; 0 off
  int int4_reg_planned;     // decode, INT4, above that: 1 the register GEMV's planned experts mode
                            // (a plan of 4- or 8-row tiles first), 0 the grouped GEMV
  int int4_reg_round;       // CudaTunables::moe_int4_reg_round
  int int4_reg_split;       // CudaTunables::moe_int4_reg_split
  int int4_reg_tile_rows;   // CudaTunables::moe_int4_reg_tile_rows
  int int4_reg_down_units;  // CudaTunables::moe_int4_reg_down_units
  int int4_reg_gate_up_warps;  // CudaTunables::moe_int4_reg_gate_up_warps
  int int4_reg_down_warps;     // CudaTunables::moe_int4_reg_down_warps
  int int4_reg_flat_down;      // CudaTunables::moe_int4_reg_flat_down
  int int4_split_gate_up;      // CudaTunables::moe_int4_split_gate_up (by ids)
  int int4_split_cluster;      // CudaTunables::moe_int4_split_cluster (0: the launcher's)
  int int4_split_warps;        // CudaTunables::moe_int4_split_warps (0: the launcher's)
  int int4_split_ring;         // CudaTunables::moe_int4_split_ring (0: the launcher's)
  int int4_flat_ctas_per_sm;   // CudaTunables::moe_int4_flat_ctas_per_sm (0: 2)
  int int4_split_tma;          // CudaTunables::moe_int4_split_tma (-1: the launcher's)
  int fp8_f16;  // decode, FP8 experts, up to kMoeStageF16MaxTokens: x and act staged in f16
                // for the f16 GEMV (CudaTunables::moe_fp8_f16)
  int fp8_f16_smem_max_tokens;  // with fp8_f16, up to this many tokens: each GEMV stages its x
                                // in shared memory where it fits (moe_gemv_stage_smem) instead
                                // of a staging launch before it; 0 never
                                // (CudaTunables::moe_fp8_f16_smem_max_tokens)
  int gemm_weight_stationary;   // prefill: the down projection on the weight-stationary GEMM
                                // where supported (CudaTunables::moe_gemm_weight_stationary)
  int gemm_pipe;          // prefill: 1 the GEMMs on the producer-warp kernel where supported (the
                          // weight-stationary down projection first; CudaTunables::moe_gemm_pipe)
  int gemm_narrow_tails;  // prefill: MoeGroupedParams::narrow_tails (CudaTunables::
                          // moe_gemm_narrow_tails)
  int combine_cluster_max_tokens;  // MoeCombineParams::cluster_max_tokens (CudaTunables::
                                   // moe_combine_cluster_max_tokens)
  int int4_down_combine;           // INT4 at T = 1: down and combine in one launch (CudaTunables::
                                   // moe_int4_down_combine; moe_experts_int4_reg.h)
  int int4_reg_rows;               // CudaTunables::moe_int4_reg_rows
  // With int4_reg_round: 1 the register GEMV's gate_up rounds its weights too, 0 (as zero-
  // initialized) it runs unrounded (CudaTunables::moe_int4_gate_up_round).
  int int4_gate_up_round;
  // 1: the split gate_up rounds its weights (CudaTunables::moe_int4_split_round); 0 (as zero-
  // initialized): group 32 unrounded; -1 unrounded where its weights come by TMA.
  int int4_split_round;
  // Or null: the stream waits on it right before the combine (the join of the side branch that
  // makes `add`: backend/side_branch.h).
  cudaEvent_t join_event;
  // Or null: the combine also runs the next layer's add_rms_norm (MoeCombineParams::norm_out;
  // CudaBackend::merge_moe_combine_norm).
  bf16_bits* norm_out;
  bf16_bits* norm_residual;
  const void* norm_w;
  float norm_eps;
  int norm_w_f32;
};
size_t moe_experts_scratch_bytes(int64_t tokens, int top_k, int num_experts, int64_t hidden,
                                 int64_t inter);
// Decode: gate_up -> down -> combine (three launches; five with FP8's f16 stages); prefill: plan
// (one or three launches) -> gate_up -> down -> combine. T = 0 launches nothing.
void launch_moe_experts(const MoeExpertsParams& p, cudaStream_t stream);
// The touched experts expected for T tokens with uniform routing: E · (1 - (1 - k/E)^T).
double moe_expected_active(int64_t tokens, int top_k, int num_experts);

static_assert(std::is_trivially_copyable_v<MoeWeights> && sizeof(MoeWeights) == 56);
static_assert(std::has_unique_object_representations_v<MoeRepackParams>);
static_assert(std::has_unique_object_representations_v<MoePlanParams>);
static_assert(std::has_unique_object_representations_v<MoeGroupedParams>);
static_assert(std::has_unique_object_representations_v<MoeStageF16Params>);
// (A float member rules out has_unique_object_representations: the size says there is no padding.)
static_assert(std::is_trivially_copyable_v<MoeCombineParams> && sizeof(MoeCombineParams) == 112);
static_assert(std::is_trivially_copyable_v<MoeExpertsParams> && sizeof(MoeExpertsParams) == 328);

}  // namespace strata::cuda
