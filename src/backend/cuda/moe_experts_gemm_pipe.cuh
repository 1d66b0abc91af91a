// The producer-warp MoE GEMM's (moe_experts_gemm_pipe.cu) CTA shape, shared-memory layout and
// work items: what its producer and consumer warps must agree on.
#pragma once

#include "backend/cuda/moe_experts.cuh"

namespace strata::cuda::moe_pipe {

using namespace moe;

constexpr int kConsumerThreads = 256;
// A third warpgroup holds the producers (the register file is split per SM sub-partition: a
// block's warps count in fours). setmaxnreg moves the producer group's registers to the
// consumers (below).
constexpr int kThreads = kConsumerThreads + 128;
constexpr int kBM = 128;  // rows of a plan tile
constexpr int kProducerWarps = 4;
constexpr int kFullCount = 32 * kProducerWarps + 1;  // the producers' lanes + one expect_tx
constexpr int kEmptyCount = kConsumerThreads / 32;   // one arrival a consumer warp
constexpr int kSmemMax = 227 * 1024;

__host__ __device__ constexpr int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The CTA's shape: a plan tile (128 x rows, the wgmma n) against 256 weight rows, each consumer
// warpgroup two m64 blocks. (Measured and dropped, session 22: an expert's plan tiles in pairs,
// 256 x rows against 128 weight rows, so that a weight is converted once per 256 x rows; four
// plan tiles a CTA, the pipeline running on across them. Both lost 3-24% through the backend.)
constexpr int kXR = 128;            // x rows a CTA
constexpr int kNB = 2;              // m64 blocks a consumer warpgroup
constexpr int kRowTiles = 8 * kNB;  // weight row tiles a CTA
constexpr int kHalf = 4 * kNB;      // SwiGLU: the CTA's gate row tiles
constexpr int kXRounds = kXR / 16;  // a producer lane's x rows (4 rows a warp a round)

// setmaxnreg's split of the launch's registers. The launch gives each of the CTA's 12 warps
// kLaunchRegs a thread (__launch_bounds__(kThreads, 1): 65,536 / 384, rounded down to 8), and a
// warpgroup's .inc waits until the others' .dec have freed what it asks: a split above the
// launch's waits forever (2026-12-04: a form at 2 x 224 + 64 hung on the device). Consumers 224
// (2 x 64 sums, 2 x 2 x 16 fragments), producers 56.
constexpr int kLaunchRegs = 65536 / kThreads / 8 * 8;
constexpr int kConsumerRegs = 224, kProducerRegs = 56;
static_assert(2 * kConsumerRegs + kProducerRegs <= 3 * kLaunchRegs,
              "setmaxnreg: the launch's registers");

template <int F>
struct PipeCfg {
  static constexpr int kTilesPerStep = 64 / moe_tile_k(F);  // weight tiles a row tile a k step
  static constexpr int kRowTileBytes = kTilesPerStep * kMoeTileBytes;
  static constexpr int kXBytes = kXR * 128;  // [x rows][64 k] bf16, 128-byte swizzle
  static constexpr int kWBytes = kRowTiles * kRowTileBytes;
  // int4: per row tile the scale records of the step's groups (one, or two at group 32: 64 B);
  // fp8: the two warpgroups' 128-row blocks' scales of the step's 128-column block.
  static constexpr int kSBytes = F == kMoeInt4 ? kRowTiles * 64 : F == kMoeFp8 ? 16 : 0;
  static constexpr int kStage = (kXBytes + kWBytes + kSBytes + 1023) / 1024 * 1024;
  static constexpr int kTail = 2 * 8 * 8 + kXR * 4 + 1024;  // barriers, row table, alignment
  static constexpr int kFit = (kSmemMax - kTail) / kStage;
  static constexpr int kStages = kFit > 8 ? 8 : kFit;
  static constexpr int kBarOff = kStages * kStage;  // full[S], then empty[S]
  static constexpr int kRowOff = kBarOff + 2 * 8 * kStages;
  static constexpr int kBytes = kRowOff + kXR * 4 + 1024;
  static constexpr int kXchg = kNB * (kXR / 2) * 128 * 4;  // SwiGLU's up sums, floats
  static_assert(kStages >= 3, "the pipeline needs three stages");
  static_assert(kBytes <= kSmemMax, "one CTA an SM");
  static_assert(kStages * kStage >= kXchg, "the SwiGLU exchange fits the stages");
};

// The CTA's row tile of consumer warpgroup v's block b, warp w (0..3): warpgroup v holds row
// tiles kHalf v .. (SwiGLU: warpgroup 0 the gate tiles, 1 the matching up tiles).
__device__ __forceinline__ int tile_of(int v, int b, int w) { return v * kHalf + 4 * b + w; }

// A CTA's work: a plan tile (expert e, rows row0 .. + rows) x weight unit nb.
struct PipeItem {
  int64_t e;
  int nb, row0, rows;
};

// Row tile `t` (0 .. kRowTiles - 1) of the CTA in the weight matrix, or -1 past n (plain) or
// inter (SwiGLU).
template <bool GLU>
__device__ __forceinline__ int row_tile_of(const MoeGroupedParams& p, int nb, int t) {
  if constexpr (GLU) {
    const int half = int(p.glu_inter / kMoeTileRows), gi = nb * kHalf + t % kHalf;
    return gi < half ? gi + (t >= kHalf ? half : 0) : -1;
  } else {
    const int rt = nb * kRowTiles + t;
    return rt < int(p.w.n / kMoeTileRows) ? rt : -1;
  }
}

// Weight units (CTAs) a tile.
template <bool GLU>
__host__ __device__ inline int64_t units_of(const MoeGroupedParams& p) {
  return GLU ? cdiv(p.glu_inter / kMoeTileRows, kHalf) : cdiv(p.w.n / kMoeTileRows, kRowTiles);
}

// CTA w's work item, or false where it has no rows: past the plan's tile count (read on the
// device) or an empty tile.
template <bool GLU>
__device__ __forceinline__ bool item_of(const MoeGroupedParams& p, int64_t w, int units,
                                        PipeItem& it) {
  const int64_t tile = w / units;
  it.nb = int(w % units);
  it.e = 0;
  if (p.offsets != nullptr) {
    if (tile >= p.counts[1]) return false;
    it.e = p.tiles[2 * tile];
    it.row0 = p.tiles[2 * tile + 1];
    it.rows = min(kXR, p.offsets[it.e + 1] - it.row0);
  } else {
    if (tile * kXR >= p.rows) return false;
    it.row0 = int(tile * kXR);
    it.rows = int(min(int64_t(kXR), p.rows - it.row0));
  }
  return it.rows > 0;
}

// The element offset in x of the item's x row r (its token's row: row_token, or the row itself
// in dense mode), -1 past the item's rows (< 2^31: the launcher checks rows · k).
__device__ __forceinline__ int32_t x_row_offset(const MoeGroupedParams& p, const PipeItem& it,
                                                int r) {
  if (r >= it.rows) return -1;
  const int64_t xr = p.row_token ? int64_t(p.row_token[it.row0 + r]) : it.row0 + r;
  return int32_t(xr * p.w.k);
}

}  // namespace strata::cuda::moe_pipe
