// The INT4 experts' register-GEMV paths of the MoE decode step (moe_experts_int4_reg.cu).
#pragma once

#include <cuda_runtime.h>

#include <type_traits>

#include "backend/cuda/moe_experts.h"

namespace strata::cuda {

// T · k <= p.int4_reg_max_assignments: gate_up and down by ids, one expert matrix per assignment;
// act and y rows in assignment order (the combine's pos is null).
bool launch_moe_int4_reg(const MoeExpertsParams& p, bf16_bits* act, bf16_bits* y,
                         cudaStream_t stream);
// Above it (p.int4_reg_planned): the plan with 4- or 8-row tiles into `plan`, then gate_up and
// down planned; act and y rows in the plan's permuted order (the combine reads them through
// plan.pos).
bool launch_moe_int4_reg_planned(const MoeExpertsParams& p, const MoePlan& plan, bf16_bits* act,
                                 bf16_bits* y, cudaStream_t stream);

// The planned down projection as one flat stream over all the plan's row tiles
// (moe_experts_int4_flat.cu; CudaTunables::moe_int4_reg_flat_down): weights rounded to bf16 as
// the register GEMV's round mode, y rows in the plan's permuted order.
struct Int4FlatDownParams {
  const bf16_bits* x;      // act [rows, k], the plan's permuted rows (gate_up's output)
  const void* packed;      // the stack's tile layout: expert e's tiles from e · expert_tiles
  const bf16_bits* scale;  // its scales (linear_int4.cuh scale_slot order)
  bf16_bits* out;          // y [rows, n]
  const int32_t* tiles;    // MoePlan::tiles: (expert, first row) per tile
  const int32_t* counts;   // MoePlan::counts ([1]: tiles in use)
  const int32_t* offsets;  // MoePlan::offsets (expert e's rows end at offsets[e + 1])
  const int32_t* ids;      // or, with no plan: the experts of max_tiles one-row assignments
  int64_t expert_tiles;    // 512-byte tiles of one expert's matrix: row_tiles · k / 64
  int64_t n;               // outputs (hidden)
  int64_t k;               // inputs (the expert's intermediate slice): 64, 128 or 256
  int row_tiles;           // int4_row_tiles(n)
  int tile_rows;           // the plan's rows per tile (<= 8)
  int max_tiles;           // the plan's bound on tiles (moe_max_tiles); by ids: assignments
  int num_experts;
  int group;        // 32, 64, 128 or 256 (k % group == 0)
  int ctas_per_sm;  // the grid: this many CTAs of 8 warps an SM (0: 2)
};
static_assert(std::has_unique_object_representations_v<Int4FlatDownParams>);
// Whether the flat kernel takes a down projection of these inputs, group and tile rows.
bool int4_flat_down_fits(int64_t k, int group, int tile_rows);
// False (nothing launched) where it does not fit.
bool launch_int4_flat_down(const Int4FlatDownParams& p, cudaStream_t stream);

// One token's down projection and combine in one launch (moe_experts_int4_down_combine.cu;
// CudaTunables::moe_int4_down_combine): the flat down projection's arithmetic by ids, then the
// combine's sum in ascending expert id, plus `add`: their bits, without the y rows.
constexpr int kInt4DownCombineMaxTopK = 8;
struct Int4DownCombineParams {
  const bf16_bits* x;      // act [top_k, k]: the token's assignments in slot order
  const void* packed;      // the down stack's tile layout: expert e's tiles from e · expert_tiles
  const bf16_bits* scale;  // its scales (linear_int4.cuh scale_slot order)
  const int32_t* ids;      // [top_k]; ids out of range contribute nothing
  const float* weights;    // [top_k]
  const bf16_bits* add;    // [n] or null: added before the output's rounding
  bf16_bits* out;          // [n]; may alias add
  int64_t expert_tiles;    // 512-byte tiles of one expert's matrix: row_tiles · k / 64
  int64_t n;               // outputs (hidden)
  int64_t k;               // inputs (the expert's intermediate slice): 64, 128 or 256
  int row_tiles;           // int4_row_tiles(n): the grid
  int top_k;               // <= kInt4DownCombineMaxTopK
  int num_experts;
  int group;  // 32, 64, 128 or 256 (k % group == 0)
};
static_assert(std::has_unique_object_representations_v<Int4DownCombineParams>);
// False (nothing launched) where it does not fit (int4_flat_down_fits, top_k).
bool launch_int4_down_combine(const Int4DownCombineParams& p, cudaStream_t stream);
// The batch-1 step with it: split gate_up by ids, the side branch's join, down + combine into
// p.out. False (nothing launched) where it does not apply: T != 1, top_k above the bound, the
// combine's norm asked for (p.norm_out), or either projection off its kernel's shapes.
bool launch_moe_int4_down_combined(const MoeExpertsParams& p, bf16_bits* act, cudaStream_t stream);

// The gate_up projection by ids (one row an assignment) with each 16-row tile pair's k split
// over the warps of a cluster of CTAs (moe_experts_int4_gate_up.cu; CudaTunables::
// moe_int4_split_gate_up): weights rounded to bf16 as the register GEMV's round mode, partial
// sums added in a fixed order (warps, then cluster ranks), act rows in assignment order.
struct Int4SplitGateUpParams {
  const bf16_bits* x;      // [tokens, k]: assignment i reads row i / x_div
  const void* packed;      // the gate_up stack's tile layout (gate rows, then up rows)
  const bf16_bits* scale;  // its scales (linear_int4.cuh scale_slot order)
  bf16_bits* out;          // act [assignments, inter]
  const int32_t* ids;      // [assignments] expert ids; one out of range stores nothing
  int64_t expert_tiles;    // 512-byte tiles of one expert's matrix: row_tiles(2 · inter) · k / 64
  int64_t k;               // inputs (hidden): a multiple of 64 and of the group
  int64_t inter;           // gate (and up) rows: a multiple of 16
  int assignments;
  int x_div;  // top-k
  int num_experts;
  int group;       // 32, 64, 128 or 256
  int cluster;     // CTAs sharing one tile pair's k: 1, 2, 4 or 8
  int warps;       // warps a CTA: 1 .. 8
  int ring;        // k tiles in flight per warp (a gate and an up piece each): 2 or 4
  int tma;         // 1: the weights by bulk copies into a shared-memory ring of batches where
                   // they fit, 0: the register ring, -1: TMA where the grid is one wave
                   // (CudaTunables::moe_int4_split_tma)
  int tma_tiles;   // TMA: k tiles a batch (set by int4_split_gate_up_shape)
  int tma_stages;  // TMA: slots a warp's ring (set by int4_split_gate_up_shape)
  int unrounded;  // 1, group 32: (128 + nibble) into the mma, −136·Σx and the scales on float32
                  // group sums (CudaTunables::moe_int4_split_round 0); 0 rounded to bf16; -1 1
                  // where tma resolves to 1 (set by int4_split_gate_up_shape)
  int pad_;
};
static_assert(std::has_unique_object_representations_v<Int4SplitGateUpParams>);
// The shape the launcher runs where the knobs are 0 (cluster, warps, ring; tma -1): every field set
// and checked; false where the kernel cannot take it (k, inter or group off its grid, a knob out of
// range).
bool int4_split_gate_up_shape(Int4SplitGateUpParams* p);
// False (nothing launched) where int4_split_gate_up_shape refuses p.
bool launch_int4_split_gate_up(Int4SplitGateUpParams p, cudaStream_t stream);

}  // namespace strata::cuda
