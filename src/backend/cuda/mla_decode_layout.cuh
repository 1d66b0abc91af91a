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

}  // namespace strata::cuda::mla_decode
