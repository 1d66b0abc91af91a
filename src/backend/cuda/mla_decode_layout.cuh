// The MLA decode kernel's row kinds, sizes, shared-memory layout and named barriers.
#pragma once

#include "backend/cuda/mla_device.cuh"

namespace strata::cuda::mla_decode {

using namespace attn;

// Latent kinds (template parameter LK) and e4m3 conversions (Cvt; MlaAttentionParams::cvt).
enum Kind : int { kBf16 = 0, kE4M3 = 1, kE5M2 = 2, kFlash = 3 };
enum Cvt : int { kCvtInt = 0, kCvtHwS = 1, kCvtHw = 2 };
constexpr int kDefaultCvt = kCvtHwS;

constexpr int kR = 512, kP = 64;
constexpr int kChunk = 64;  // keys a stage
constexpr int kSWarps = 4, kPvWarps = 4;
constexpr int kThreads = (kSWarps + kPvWarps) * 32;
constexpr int kMaxRows = 16;
constexpr int kMaxStages = 6;
// Shared memory: mbarriers, the row-max exchange, the per-chunk rescale factors, the final row
// sums and maxima, P (two buffers), then the stages.
constexpr int kFullOff = 0;
constexpr int kEmptyOff = kFullOff + 8 * kMaxStages;
constexpr int kRedOff = kEmptyOff + 8 * kMaxStages;             // [2][kSWarps][16] float
constexpr int kCorrOff = kRedOff + 2 * kSWarps * kMaxRows * 4;  // [2][16] float
constexpr int kLsumOff = kCorrOff + 2 * kMaxRows * 4;           // [kSWarps][16] float
constexpr int kMOff = kLsumOff + kSWarps * kMaxRows * 4;        // [16] float
constexpr int kPStride = kChunk * 2 + 16;  // bytes a P row (9 16-byte units: ldmatrix rows hit
                                           // distinct banks)
constexpr int kPOff = 1152;
constexpr int kStageOff = kPOff + 2 * kMaxRows * kPStride;
static_assert(kMOff + kMaxRows * 4 <= kPOff && kStageOff % 128 == 0, "shared memory layout");
// Named barriers (0 is __syncthreads).
constexpr int kBarMax = 1;    // the S warps' row maxima (128 threads)
constexpr int kBarReady = 2;  // + buffer: P and the rescale factors written (S arrive, PV sync)
constexpr int kBarFree = 4;   // + buffer: the PV warps are done with them (PV arrive, S sync)
constexpr int kBarFinal = 6;  // the S warps' row sums and maxima written

// Bytes between two rows of a stage: the row rounded up to an odd number of 16-byte units (the 8
// rows of an ldmatrix, and the 4 keys x 2 lanes of a quarter-warp's 16-byte loads, hit distinct
// banks).
__host__ __device__ constexpr int stage_stride(int64_t row_bytes) {
  const int units = int((row_bytes + 15) / 16);
  return (units | 1) * 16;
}

// Where a stage keeps its 64 rows, and which key each of the four 16-key tiles (S warp t, PV
// k-step t) takes as its row m. Two layouts (MlaAttentionParams::row_groups):
//  - single rows (group 1): key 16 t + m, rows stage_stride apart: one bulk copy a row, 64 a
//    stage;
//  - groups of 4 (the default where the page size is a multiple of 4): keys 4j..4j+3 are
//    consecutive slots of one page (chunks start at multiples of 64), so they are one bulk copy
//    into one group, groups stage_stride(4 rows) apart: 16 copies a stage. Why: the TMA engine
//    moves small copies well below the bandwidth (a loads-only run of the single-row layout
//    reached 74.5% of copy at 64 copies of 1,152 bytes a stage). Tile t takes key 4m + t, so the
//    8 rows of an ldmatrix (m = 0..7 or 8..15) lie in 8 groups an odd number of 16-byte units
//    apart: distinct banks, as with single rows. Rows inside a group are 4 row-bytes apart,
//    which no single load ever mixes.
// Both layouts place tile t's row m at m · gs + t · tstep.
struct StageLayout {
  int group_log2;  // 0 or 2
  int rb;          // row bytes
  int gs;          // bytes between two groups
  int tstep;       // bytes between tile t's and tile t + 1's row m
  __host__ __device__ constexpr StageLayout(int64_t row_bytes, bool groups)
      : group_log2(groups ? 2 : 0),
        rb(int(row_bytes)),
        gs(stage_stride(groups ? 4 * row_bytes : row_bytes)),
        tstep(groups ? int(row_bytes) : 16 * stage_stride(row_bytes)) {}
  __host__ __device__ constexpr int stage_bytes() const { return (kChunk >> group_log2) * gs; }
  // Key (0..63 within the chunk) of tile t's row m, and that row's offset in the stage.
  __host__ __device__ constexpr int key(int t, int m) const {
    return group_log2 ? 4 * m + t : 16 * t + m;
  }
  __host__ __device__ constexpr int tile_row(int t, int m) const { return m * gs + t * tstep; }
};
// Whether a call copies groups of 4 rows: allowed by the plan and every group within a page.
__host__ __device__ constexpr bool use_row_groups(int row_groups, int page_size) {
  return row_groups != 0 && page_size % 4 == 0;
}

}  // namespace strata::cuda::mla_decode
