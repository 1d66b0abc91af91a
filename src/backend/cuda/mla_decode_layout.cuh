// The MLA decode kernel's row kinds, sizes, shared-memory layout and named barriers.
#pragma once

#include "backend/cuda/mla_device.cuh"

namespace strata::cuda::mla_decode {

using namespace attn;

// Latent kinds (template parameter LK) and e4m3 conversions (Cvt; MlaAttentionParams::cvt).
enum Kind : int { kBf16 = 0, kE4M3 = 1, kE5M2 = 2, kFlash = 3 };
enum Cvt : int { kCvtInt = 0, kCvtHwS = 1, kCvtHw = 2, kCvtTile = 3 };
constexpr int kDefaultCvt = kCvtHwS;
static_assert(int(kCvtTile) == int(kMlaCvtTile) && int(kCvtHwS) == int(kMlaCvtHwS), "MlaCvt");

constexpr int kR = 512, kP = 64;
constexpr int kChunk = 64;                // keys a stage
constexpr int kSWarps = 4, kPvWarps = 4;  // S warps a group, PV warps
// The S warps' form SG (MlaAttentionParams::s_groups; mla_decode_s_warps.cuh says why): 1 one
// group of 4; at 16 rows, two groups of 4 that take 8 rows each (kSRows) or half the latent and
// rope dims of every row each, then trade their partial scores (kSDims).
enum SForm : int { kSOne = 1, kSRows = 2, kSDims = 3 };
__host__ __device__ constexpr int s_group_count(int sg) { return sg == kSOne ? 1 : 2; }
__host__ __device__ constexpr int block_threads(int sg) {
  return (s_group_count(sg) * kSWarps + kPvWarps) * 32;
}
constexpr int kThreads = block_threads(kSOne);
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

// The V tile (Cvt kCvtTile, e4m3 latent values): the S warps store the f16 values they convert
// for their keys' scores into a tile of the chunk's 64 rows (tile row 16 t + m: S warp t's row m,
// P's column 16 t + m) x 512 values, and the PV warps read V from it by ldmatrix.trans as from bf16
// rows, so each value is converted once instead of once a warp role; FlashMLA rows also leave their
// four tile scales of each key there. Two buffers (P's), then the stages: the S warps free a
// stage once they have read it (the PV warps never read stages), so 2 stages suffice. Rows are
// 1,024 bytes, their 16-byte units XOR-swizzled by vtile_swizzle(row % 8): the 8 rows of an
// ldmatrix hit 8 distinct units mod 8, and so do a half-warp's 8-byte stores (rows g = 0..3 of
// an S warp, 4 q: units 4 j + q / 2 and 4 j + 2 + q / 2).
constexpr int kVRowBytes = kR * 2;
constexpr int kVTileBytes = kChunk * kVRowBytes;
constexpr int kVScaleBytes = kChunk * 16;
constexpr int kVScaleOff = kStageOff + 2 * kVTileBytes;  // [2][64 rows][4] float
constexpr int kVTileAreaBytes = 2 * (kVTileBytes + kVScaleBytes);
static_assert(kVTileAreaBytes % 128 == 0, "stages stay 128-byte aligned");
__host__ __device__ constexpr int vtile_swizzle(int r8) { return 2 * (r8 & 3) + ((r8 >> 2) & 1); }
// Whether a call runs with the V tile (its shared memory holds it before the stages).
__host__ __device__ constexpr bool uses_vtile(int latent_elem, int cvt) {
  return latent_elem == kMlaE4M3 && cvt == kCvtTile;
}
// Named barriers (0 is __syncthreads).
constexpr int kBarMax = 1;    // the S warps' row maxima (128 threads)
constexpr int kBarReady = 2;  // + buffer: P and the rescale factors written (S arrive, PV sync)
constexpr int kBarFree = 4;   // + buffer: the PV warps are done with them (PV arrive, S sync)
constexpr int kBarFinal = 6;  // the S warps' row sums and maxima written
constexpr int kBarMax1 = 7;   // the second S group's row maxima (two groups; 128 threads)
constexpr int kBarXchg = 8;   // kSDims: both groups' partial scores written (256 threads)
// kSDims: the partial scores a group's warp leaves for the other group's rows, after the stages:
// [2 buffers (chunk parity)][2 groups][kSWarps][32 lanes] float4.
constexpr int kXchgBytes = 2 * 2 * kSWarps * 32 * 16;

// Bytes between two rows of a stage: the row rounded up to an odd number of 16-byte units (the 8
// rows of an ldmatrix, and the 4 keys x 2 lanes of a quarter-warp's 16-byte loads, hit distinct
// banks).
__host__ __device__ constexpr int stage_stride(int64_t row_bytes) {
  const int units = int((row_bytes + 15) / 16);
  return (units | 1) * 16;
}

// Where a stage keeps its 64 rows, and which key each of the four 16-key tiles (S warp t, PV
// k-step t) takes as its row m. Three layouts (MlaAttentionParams::row_groups):
//  - single rows (group 1): key 16 t + m, rows stage_stride apart: one bulk copy a row, 64 a
//    stage;
//  - groups of G = 4 or 8 rows (where the page size is a multiple of G): keys G j..G j + G - 1
//    are consecutive slots of one page (chunks start at multiples of 64), so they are one bulk
//    copy into one group, groups stage_stride(G rows) apart: 64 / G copies a stage. Why: the TMA
//    engine moves small copies well below the bandwidth (a loads-only run of the single-row
//    layout reached 74.5% of copy at 64 copies of 1,152 bytes a stage; groups of 4 took bf16
//    from 55.7% to 74.9% in all). Tile t's row m is row t + 4 (m / NG) of group m % NG (NG =
//    64 / G groups, so that is key G (m % NG) + 4 (m / NG) + t): the 8 rows of an ldmatrix (m =
//    0..7 or 8..15) lie in 8 distinct groups an odd number of 16-byte units apart, hence in
//    distinct banks, as with single rows. Rows inside a group are row-bytes apart, which no
//    single load ever mixes.
// Every layout places tile t's row m at tile_row(0, m) + t · tstep.
struct StageLayout {
  int group_log2;  // 0, 2 or 3
  int rb;          // row bytes
  int gs;          // bytes between two groups
  int tstep;       // bytes between tile t's and tile t + 1's row m
  __host__ __device__ constexpr StageLayout(int64_t row_bytes, int group_log2_)
      : group_log2(group_log2_),
        rb(int(row_bytes)),
        gs(stage_stride(row_bytes << group_log2_)),
        tstep(group_log2_ ? int(row_bytes) : 16 * stage_stride(row_bytes)) {}
  __host__ __device__ constexpr int group_rows() const { return 1 << group_log2; }
  __host__ __device__ constexpr int groups() const { return kChunk >> group_log2; }
  __host__ __device__ constexpr int stage_bytes() const { return groups() * gs; }
  // Key (0..63 within the chunk) of tile t's row m, and that row's offset in the stage.
  __host__ __device__ constexpr int key(int t, int m) const {
    if (group_log2 == 0) return 16 * t + m;
    return ((m % groups()) << group_log2) + 4 * (m / groups()) + t;
  }
  __host__ __device__ constexpr int tile_row(int t, int m) const {
    if (group_log2 == 0) return m * gs + t * tstep;
    return (m % groups()) * gs + (4 * (m / groups()) + t) * rb;
  }
};
// The rows a call copies at once (log2: 0 single rows, 2 groups of 4, 3 groups of 8): what the
// plan asks for (row_groups 0, 1 or 2) where every group stays within a page, else smaller.
__host__ __device__ constexpr int row_group_log2(int row_groups, int page_size) {
  if (row_groups >= 2 && page_size % 8 == 0) return 3;
  if (row_groups >= 1 && page_size % 4 == 0) return 2;
  return 0;
}
// The layouts' key and row maps are permutations of the chunk's 64 keys and distinct rows (checked
// at compile time for the FlashMLA row size).
constexpr bool layout_is_permutation(int64_t row_bytes, int group_log2) {
  const StageLayout lay(row_bytes, group_log2);
  bool seen[kChunk] = {};
  for (int t = 0; t < 4; ++t)
    for (int m = 0; m < 16; ++m) {
      const int k = lay.key(t, m);
      if (k < 0 || k >= kChunk || seen[k]) return false;
      seen[k] = true;
      // the row holding key k: group k / G at row k % G
      const int g = k >> group_log2, r = k & ((1 << group_log2) - 1);
      const int want = group_log2 ? g * lay.gs + r * lay.rb : lay.tile_row(t, m);
      if (lay.tile_row(t, m) != want || lay.tile_row(t, m) != lay.tile_row(0, m) + t * lay.tstep)
        return false;
    }
  return true;
}
static_assert(layout_is_permutation(656, 0) && layout_is_permutation(656, 2) &&
                  layout_is_permutation(656, 3) && layout_is_permutation(1152, 3),
              "stage layouts");

}  // namespace strata::cuda::mla_decode
