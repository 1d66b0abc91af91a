// The register GEMV's launch plan (linear_int4_reg.cu's kernel takes it as an argument): its
// limits, the layout of one launch's shared memory and work split, and choose_reg, the host
// arithmetic that makes it from Int4LinearParams (knobs or defaults). Host code only: the kernel
// file holds the device side and the instantiations.
#pragma once

#include <cstdint>

#include "backend/cuda/linear_int4.h"

namespace strata::cuda::int4_reg {

// Up to 16 warps a block: the bound caps registers at 128 a thread, as two blocks of 8 warps
// per SM did (the default stays 8 warps: two blocks resident per SM); 16 for launches of fewer
// blocks than SMs (MoE decode at a few tokens: gate_up of 8 experts is 128 blocks).
constexpr int kMaxWarps = 16;
constexpr int kMaxTokens = 8;   // one mma n tile
constexpr int kMaxGroup = 256;  // the instantiated k tiles a scale group: 1, 2 or 4 (or group 32)
constexpr int kDefaultWarps = 8;
constexpr int kDefaultUnroll = 16;
constexpr int64_t kExpertUnitsPerBlock = 32;  // experts modes: row tiles (or SwiGLU pairs) a block
constexpr int kSmemPerSm = 228 * 1024;        // sm_90: shared memory per SM
constexpr int kSmemPerBlockReserved = 1024;
constexpr int kSmemMax = 227 * 1024;

// Host-computed layout of one launch (kernel argument; see choose_reg).
struct Int4RegPlan {
  int kt;                              // k tiles per row tile
  int units;                           // row tiles, or gate/up pairs (SwiGLU)
  int inter_tiles;                     // SwiGLU: row tiles of the gate half; 0 plain
  int slots;                           // partial-sum row tiles per warp
  int trigger;                         // kInt4Trigger*
  uint32_t off_part, off_span, bytes;  // staged x at offset 0 (left unused by the raw-x form)
  uint32_t off_xrow;       // planned experts: the tile's x rows (8 ints); dense: x_tma's mbarrier
  uint32_t off_xraw;       // dense, Int4LinearParams::gemv_x_tma: x's rows as one bulk copy; 0 off
  Int4RegExperts experts;  // ids and tiles null: a dense linear (linear_int4.h)
  int64_t expert_tiles;    // experts: tiles of one expert's matrix (row tiles x kt)
  int blocks_per_assignment;
  int pad_;
};

struct RegLaunch {
  int warps, unroll, rows, grid;
  bool round;
  bool raw_x;     // the m = 1 form that reads x's row as it arrived (int4_gemv_reg_kernel's kRawX)
  uint32_t smem;  // dynamic shared memory requested: pl.bytes, padded for the residency depth
  Int4RegPlan pl;
};

// The configuration launch_int4_gemv_reg runs for p (knobs or defaults); false where the kernel
// cannot take p: m > 8, group > 256, a knob out of range, or x (m·k·2 bytes) and the partial
// sums over 227 KB of shared memory.
bool choose_reg(const Int4LinearParams& p, const Int4RegExperts* ex, RegLaunch* out);

}  // namespace strata::cuda::int4_reg
