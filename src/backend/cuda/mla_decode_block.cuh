// What the MLA decode kernel's two warp roles share (mla_decode_kernel.cuh): the compile-time facts
// of a row kind and conversion, the wait profile, and the block's setup before the roles split.
#pragma once

#include "backend/cuda/mla_decode_layout.cuh"

namespace strata::cuda::mla_decode {

// Row kind LK and e4m3 conversion CVT (mla_decode.cuh says what each is for).
template <int LK, int CVT>
struct KindTraits {
  static constexpr bool kFp8 = LK != kBf16;
  static constexpr int kLatElem = LK == kBf16 ? kMlaBf16 : LK == kE5M2 ? kMlaE5M2 : kMlaE4M3;
  static constexpr bool kE4 = kLatElem == kMlaE4M3;
  static constexpr bool kSHw =
      kE4 && CVT != kCvtInt;  // S warps convert e4m3 by the conversion unit
  static constexpr bool kPvHw = kE4 && CVT == kCvtHw;
  static constexpr float kConvS = kE4 && !kSHw ? 256.0f : 1.0f;  // integer e4m3 reads value · 2^-8
  static constexpr bool kVT =
      kE4 && CVT == kCvtTile;  // V through the shared f16 tile (kVTileBytes)
  static constexpr float kConvV = kE4 && !kPvHw && !kVT ? 256.0f : 1.0f;
  static constexpr int kStages0 = kStageOff + (kVT ? kVTileAreaBytes : 0);  // the first stage
  static constexpr bool kPairs02 = !kSHw;
};

// The SM's cycle counter (a non-template function: the host pass never sees clock64's uses).
__device__ __forceinline__ uint64_t cycles() { return clock64(); }

// p.prof (benchmarks, PROF): cycles of a role's waits, summed by lane 0 of each warp at its end.
// The product's kernels (PROF false) carry none of its code.
template <bool PROF>
struct WaitProfile {
  uint64_t start;
  uint64_t waits[3] = {0, 0, 0};
  __device__ __forceinline__ WaitProfile() : start(PROF ? cycles() : 0) {}
  __device__ __forceinline__ uint64_t tick() const { return PROF ? cycles() : 0; }
  __device__ __forceinline__ void tock(int k, uint64_t since) {
    if (PROF) waits[k] += cycles() - since;
  }
  // Adds the waits to p.prof[first..first + 2] and the role's cycles to p.prof[total].
  __device__ __forceinline__ void flush(const MlaAttentionParams& p, int lane, int first,
                                        int total) const {
    if (!PROF || lane != 0) return;
    for (int k = 0; k < 3; ++k)
      atomicAdd(reinterpret_cast<unsigned long long*>(p.prof + first + k),
                (unsigned long long)waits[k]);
    atomicAdd(reinterpret_cast<unsigned long long*>(p.prof + total),
              (unsigned long long)(cycles() - start));
  }
};

// The block's setup, done by the kernel before its warps take their roles.
struct Block {
  const mla::BlockWork& w;  // the sequence, rows and keys of this block
  int warp, lane;
  int g, q;  // the lane's mma fragment row (lane / 4) and column pair (lane % 4)
  int NS;    // stages (p.stages)
  StageLayout lay;
  bool groups;  // rows copied in groups (lay.group_log2 != 0) of G
  int G;
  int stage_bytes;
  char* smem;       // dynamic shared memory (mla_decode_layout.cuh)
  uint32_t smem_s;  // its shared-space address
  uint32_t stage0;  // stage 0's shared-space address
  int nchunks;
};

}  // namespace strata::cuda::mla_decode
