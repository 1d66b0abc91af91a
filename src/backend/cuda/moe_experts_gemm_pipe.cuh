// The producer-warp MoE GEMM's (moe_experts_gemm_pipe.cu) CTA shapes, shared-memory layout and
// work items: what its producer and consumer warps must agree on.
#pragma once

#include "backend/cuda/moe_experts.cuh"

namespace strata::cuda::moe_pipe {

using namespace moe;

constexpr int kConsumerThreads = 256;
// A third warpgroup holds the producers (the register file is split per SM sub-partition: a
// block's warps count in fours). setmaxnreg moves the producer group's registers to the
// consumers (Regs below).
constexpr int kThreads = kConsumerThreads + 128;
constexpr int kBM = 128;  // rows of a plan tile
constexpr int kProducerWarps = 4;
constexpr int kFullCount = 32 * kProducerWarps + 1;  // the producers' lanes + one expect_tx
constexpr int kEmptyCount = kConsumerThreads / 32;   // one arrival a consumer warp
constexpr int kSmemMax = 227 * 1024;

__host__ __device__ constexpr int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The CTA's shape. P = false: a plan tile (128 x rows) against 256 weight rows, each consumer
// warpgroup two m64 blocks. P = true (paired tiles): an expert's plan tiles 2i and 2i + 1 (256 x
// rows) against 128 weight rows, each warpgroup one m64 block at wgmma n up to 256, so that a
// weight is converted once per 256 x rows, not 128 (FP8 and INT4 gate_up spend much of their
// issue slots on the conversions: ncu, H200, 2026-12-04).
template <bool P>
struct Shape {
  static constexpr int kXR = P ? 256 : 128;  // x rows a CTA (the largest wgmma n)
  static constexpr int kNB = P ? 1 : 2;      // m64 blocks a consumer warpgroup
  static constexpr int kRowTiles = 8 * kNB;  // weight row tiles a CTA
  static constexpr int kHalf = 4 * kNB;      // SwiGLU: the CTA's gate row tiles
  static constexpr int kXRounds = kXR / 16;  // a producer lane's x rows (4 rows a warp a round)
};

// setmaxnreg's split of the launch's registers. The launch gives each of the CTA's 12 warps
// kLaunchRegs a thread (__launch_bounds__(kThreads, 1): 65,536 / 384, rounded down to 8), and a
// warpgroup's .inc waits until the others' .dec have freed what it asks: a split above the
// launch's waits forever (2026-12-04: M at 2 x 224 + 64 hung on the device). Consumers: one tile
// 224 (2 x 64 sums, 2 x 2 x 16 fragments); paired 200 (half the sums) for producers holding twice
// the x rows (104); M 216 for producers that compute their rows' offsets (64).
constexpr int kLaunchRegs = 65536 / kThreads / 8 * 8;
template <bool P, bool M>
struct Regs {
  static constexpr int kConsumer = P ? 200 : 224;
  static constexpr int kProducer = P ? 104 : 56;
  static_assert(2 * kConsumer + kProducer <= 3 * kLaunchRegs, "setmaxnreg: the launch's registers");
};

template <int F, bool P>
struct PipeCfg {
  using S = Shape<P>;
  static constexpr int kTilesPerStep = 64 / moe_tile_k(F);  // weight tiles a row tile a k step
  static constexpr int kRowTileBytes = kTilesPerStep * kMoeTileBytes;
  static constexpr int kXBytes = S::kXR * 128;  // [x rows][64 k] bf16, 128-byte swizzle
  static constexpr int kWBytes = S::kRowTiles * kRowTileBytes;
  // int4: per row tile the scale records of the step's groups (one, or two at group 32: 64 B);
  // fp8: the two warpgroups' 128-row blocks' scales of the step's 128-column block.
  static constexpr int kSBytes = F == kMoeInt4 ? S::kRowTiles * 64 : F == kMoeFp8 ? 16 : 0;
  static constexpr int kStage = (kXBytes + kWBytes + kSBytes + 1023) / 1024 * 1024;
  static constexpr int kTail = 2 * 8 * 8 + S::kXR * 4 + 1024;  // barriers, row table, alignment
  static constexpr int kFit = (kSmemMax - kTail) / kStage;
  static constexpr int kStages = kFit > 8 ? 8 : kFit;
  static constexpr int kBarOff = kStages * kStage;  // full[S], then empty[S]
  static constexpr int kRowOff = kBarOff + 2 * 8 * kStages;
  static constexpr int kBytes = kRowOff + S::kXR * 4 + 1024;
  static constexpr int kXchg = S::kNB * (S::kXR / 2) * 128 * 4;  // SwiGLU's up sums, floats
  static_assert(kStages >= 3, "the pipeline needs three stages");
  static_assert(kBytes <= kSmemMax, "one CTA an SM");
  static_assert(kStages * kStage >= kXchg, "the SwiGLU exchange fits the stages");
};

// The CTA's row tile of consumer warpgroup v's block b, warp w (0..3): warpgroup v holds row
// tiles kHalf v .. (SwiGLU: warpgroup 0 the gate tiles, 1 the matching up tiles).
template <bool P>
__device__ __forceinline__ int tile_of(int v, int b, int w) {
  return v * Shape<P>::kHalf + 4 * b + w;
}
// Several items a CTA (M, SwiGLU): block 0 gate row tile 4 v + w, block 1 its up row tile, so
// that one thread holds both sums of an output (no exchange through the stages, which the next
// item's copies use). The fp8 scale slot of block b is then b (otherwise the warpgroup's, v).
template <bool GLU, bool P, bool M>
__device__ __forceinline__ int tile_of(int v, int b, int w) {
  return GLU && M ? 8 * b + 4 * v + w : tile_of<P>(v, b, w);
}

// Items a CTA with M (straight-line code: ptxas serialized the wgmma of a loop over items).
constexpr int kItems = 4;

// A work item: plan tile `tile` (paired: its pair) x weight unit nb.
struct PipeItem {
  int64_t e;
  int nb, row0, rows;
};

// Row tile `t` (0 .. kRowTiles - 1) of the CTA in the weight matrix, or -1 past n (plain) or
// inter (SwiGLU).
template <bool GLU, bool P>
__device__ __forceinline__ int row_tile_of(const MoeGroupedParams& p, int nb, int t) {
  using S = Shape<P>;
  if constexpr (GLU) {
    const int half = int(p.glu_inter / kMoeTileRows), gi = nb * S::kHalf + t % S::kHalf;
    return gi < half ? gi + (t >= S::kHalf ? half : 0) : -1;
  } else {
    const int rt = nb * S::kRowTiles + t;
    return rt < int(p.w.n / kMoeTileRows) ? rt : -1;
  }
}

// Weight units (CTAs) a tile.
template <bool GLU, bool P>
__host__ __device__ inline int64_t units_of(const MoeGroupedParams& p) {
  using S = Shape<P>;
  return GLU ? cdiv(p.glu_inter / kMoeTileRows, S::kHalf)
             : cdiv(p.w.n / kMoeTileRows, S::kRowTiles);
}

// Work item w (blockIdx.x without M), or false where it has no rows: past the plan's tile count
// (read on the device), an empty tile, or (paired) an expert's odd plan tile, which is its even
// neighbour's second half.
template <bool GLU, bool P>
__device__ __forceinline__ bool item_of(const MoeGroupedParams& p, int64_t w, int units,
                                        PipeItem& it) {
  constexpr int kXR = Shape<P>::kXR;
  const int64_t tile = w / units;
  it.nb = int(w % units);
  it.e = 0;
  if (p.offsets != nullptr) {
    if (tile >= p.counts[1]) return false;
    it.e = p.tiles[2 * tile];
    it.row0 = p.tiles[2 * tile + 1];
    if (P && ((it.row0 - p.offsets[it.e]) / kBM) % 2 == 1) return false;
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
