// Pieces shared by the paged attention kernels on mma.sync:
// - the cp.async page gather of the decode kernel (attention_decode.cu), which the split-KV
//   prefill kernel (attention_prefill_split.cu) runs too: one KV head's K and V rows of a
//   sequence's keys [begin, end), in chunks, kStages chunks in flight, through a slot table in
//   shared memory filled one chunk ahead of its copies;
// - the output epilogue of the mma.sync prefill kernel (bench/cuda/dev), which the split-KV
//   prefill kernel's single-split tiles share: the quad's row sum, then one normalized bf16 row.
// All device functions are __forceinline__: the kernels compile as when these were written inline.
#pragma once

#include <cstdint>

#include "backend/cuda/attention.h"
#include "backend/cuda/attention_mma.cuh"
#include "backend/cuda/common.cuh"
#include "backend/cuda/fp8.cuh"

namespace strata::cuda::attn {

// Shared-memory geometry of the gather: kStages stages of kChunk K rows then kChunk V rows (D
// elements of kind E each, a 16-byte pad per row keeps the fragment reads conflict-free), then
// the slot table [kStages][kChunk] (the cache slots of the chunks in flight, -1 past the end).
template <int D, int E, int Chunk, int Stages, int Threads>
struct PagedKvLayout {
  static constexpr int kChunk = Chunk;
  static constexpr int kStages = Stages;
  static constexpr int kThreads = Threads;
  static constexpr int kEb = E == kKvBf16 ? 2 : 1;
  static constexpr int kRowBytes = D * kEb;
  static constexpr int kStride = kRowBytes + 16;
  static constexpr int kPieces = kRowBytes / 16;            // 16-byte pieces per row
  static constexpr int kStageBytes = 2 * kChunk * kStride;  // K rows, then V rows
  static constexpr int kSlotOff = kStages * kStageBytes;
  static constexpr int kLoopBytes = kSlotOff + kStages * kChunk * 4;  // stages + slot table
  static constexpr int kRowStep = kThreads / kPieces;  // rows apart of one thread's pieces
  // Rows one thread copies per chunk (small rows: fewer than one, threads past kChunk idle).
  static constexpr int kRowsPerThread = kRowStep >= kChunk ? 1 : kChunk / kRowStep;
};

// One block's gather of KV head `kvh` (L: a PagedKvLayout of head size D). Keys past `end` get
// zero rows (cp.async zero fill): P is 0 there, and 0 · (stale bits) could be NaN. The slots come
// from the table in shared memory, filled one chunk ahead of their copies, so the copies never
// wait on a page-table load. The kernel calls start(), then in iteration c of its chunk loop,
// after the wait for chunk c and the barrier: load_chunk(c + kStages - 1) (while c + kStages - 1
// < nchunks) and a commit; early, its thread's slot_of() for key begin + (c + kStages)·kChunk +
// tid; last, that slot into table stage c % kStages (read again copying chunk c + kStages). These
// few lines stay in the kernels: as member functions they changed the generated code (ptxas orders
// the loop's set-up differently), written out there they compile as before, instruction for
// instruction.
template <class L, int D>
struct PagedKvGather {
  char* smem;            // the stages, at 0
  int32_t* slots;        // the slot table, at L::kSlotOff
  const int32_t* pages;  // the sequence's page table
  int page_size;
  int begin, end;  // keys
  int64_t kdim;    // elements per cache slot: kv_heads · D
  int kvh;
  const char* kc;  // the K and V caches
  const char* vc;
  int tid;

  __device__ __forceinline__ int slot_of(int j) const {
    return pages[j / page_size] * page_size + j % page_size;
  }

  // Issues the copies of `chunk` (its slots in table stage chunk % kStages) into its stage.
  __device__ __forceinline__ void load_chunk(int chunk) const {
    const uint32_t kb = smem_addr(smem + (chunk % L::kStages) * L::kStageBytes);
    const uint32_t vb = kb + L::kChunk * L::kStride;
    const int32_t* st = slots + (chunk % L::kStages) * L::kChunk;
    const int piece = tid % L::kPieces, r0 = tid / L::kPieces;
#pragma unroll
    for (int i = 0; i < L::kRowsPerThread; ++i) {
      const int r = r0 + i * L::kRowStep;
      if (L::kRowStep > L::kChunk && r >= L::kChunk) break;
      const int slot = st[r];
      const int64_t off =
          slot >= 0 ? (int64_t(slot) * kdim + int64_t(kvh) * D) * L::kEb + piece * 16 : 0;
      const uint32_t d = uint32_t(r * L::kStride + piece * 16);
      cp_async16_zfill(kb + d, kc + off, slot >= 0 ? 16 : 0);
      cp_async16_zfill(vb + d, vc + off, slot >= 0 ? 16 : 0);
    }
  }

  // Fills the table for chunks 0 .. kStages-1 and issues chunks 0 .. kStages-2 (a commit group
  // each, empty past nchunks).
  __device__ __forceinline__ void start(int nchunks) const {
    for (int i = tid; i < L::kStages * L::kChunk; i += L::kThreads) {
      const int j = begin + i;  // chunks 0 .. kStages-1 fill the table's stages in order
      slots[i] = j < end ? slot_of(j) : -1;
    }
    __syncthreads();
    issue_first(nchunks);
  }
  // start() with key `skip` (one the previous kernel writes) at slot -1, a zero row, for a kernel
  // that issues it before its PDL wait (attention_decode.cu's EARLY). Not start(skip = -1): that
  // form changed the split-KV prefill kernel's code (two instances spilled 4 bytes, 2026-12-07).
  __device__ __forceinline__ void fill_table(int skip) const {
    for (int i = tid; i < L::kStages * L::kChunk; i += L::kThreads) {
      const int j = begin + i;  // chunks 0 .. kStages-1 fill the table's stages in order
      slots[i] = j < end && j != skip ? slot_of(j) : -1;
    }
    __syncthreads();
  }
  __device__ __forceinline__ void issue_first(int nchunks) const {
#pragma unroll
    for (int c = 0; c < L::kStages - 1; ++c) {
      if (c < nchunks) load_chunk(c);
      cp_async_commit();
    }
  }
};

// ---- K/V fragments of the mma (decode and split-KV prefill) ----
// fp8 caches run the mma in f16 (every e4m3 and e5m2 value is an f16, so K and V fragments are
// one conversion instruction away; Q and P are rounded to f16 instead of bf16, which keeps more
// mantissa); bf16 caches run it in bf16 (mma_sync.cuh).
template <int E>
__device__ __forceinline__ void mma_kv(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  if constexpr (E == kKvBf16)
    mma_bf16_16816(c, a, b0, b1);
  else
    mma_f16_16816(c, a, b0, b1);
}
// Two fp8 values (low byte first) as an f16 pair (exact).
template <int E>
__device__ __forceinline__ uint32_t fp8x2_to_f16x2(uint32_t v) {
  if constexpr (E == kKvE4M3) {
    uint32_t h2;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(uint16_t(v)));
    return h2;
  } else {
    return (v & 0xffu) << 8 | (v & 0xff00u) << 16;
  }
}
// Elements [c, c + 1] of a smem row of element type E, as an mma input pair.
template <int E>
__device__ __forceinline__ uint32_t pair_at(const char* row, int c) {
  if constexpr (E == kKvBf16)
    return *reinterpret_cast<const uint32_t*>(row + 2 * c);
  else
    return fp8x2_to_f16x2<E>(*reinterpret_cast<const uint16_t*>(row + c));
}
// Element c of row r0 (low half) and of row r1 (high half), as an mma input pair.
template <int E>
__device__ __forceinline__ uint32_t column_pair(const char* r0, const char* r1, int c) {
  if constexpr (E == kKvBf16) {
    return uint32_t(*reinterpret_cast<const uint16_t*>(r0 + 2 * c)) |
           (uint32_t(*reinterpret_cast<const uint16_t*>(r1 + 2 * c)) << 16);
  } else {
    return fp8x2_to_f16x2<E>(uint32_t(uint8_t(r0[c])) | (uint32_t(uint8_t(r1[c])) << 8));
  }
}

// ---- output epilogue (FA prefill and split-KV prefill) ----
// The sum of x over the 4 lanes of a quad (the lanes holding one row of an mma C fragment).
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  x += __shfl_xor_sync(0xffffffffu, x, 2);
  return x;
}

// Row r of a query tile — (token q_row0 + r / group, query head kvh · group + r % group) — as
// bf16: this lane's columns 8·dt + c2 and + 1 of o's row half h (C elements 2h, 2h + 1), times inv.
template <int D>
__device__ __forceinline__ void store_out_row(const AttentionParams& p, int q_row0, int kvh,
                                              int group, int r, const float (&o)[D / 8][4], int h,
                                              int c2, float inv) {
  bf16_bits* dst =
      p.out + (int64_t(q_row0 + r / group) * p.heads + kvh * group + r % group) * D + c2;
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt)
    *reinterpret_cast<uint32_t*>(dst + dt * 8) =
        pack_bf16x2(o[dt][2 * h] * inv, o[dt][2 * h + 1] * inv);
}

}  // namespace strata::cuda::attn
