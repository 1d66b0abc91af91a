// The MLA decode kernel itself (its design: mla_decode.cuh): the block's setup, then the S warps
// (mla_decode_s_warps.cuh) and the PV warps (mla_decode_pv_warps.cuh), then (p.merge_counters)
// the split merge of a tile's last block (mla_decode_merge.cuh).
#pragma once

#include "backend/cuda/mla_decode_block.cuh"
#include "backend/cuda/mla_decode_merge.cuh"
#include "backend/cuda/mla_decode_pv_warps.cuh"
#include "backend/cuda/mla_decode_s_warps.cuh"

namespace strata::cuda::mla_decode {

// PROF: the wait profile (p.prof, benchmarks) compiled in; the product's kernels (PROF false)
// carry none of its code. SG: the S warps' form (SForm, MlaAttentionParams::s_groups; two groups
// only at NT = 2: mla_decode_s_warps.cuh).
template <int NT, int LK, int CVT, bool PROF, int SG = 1>
__global__ void __launch_bounds__(block_threads(SG), 1) mla_decode_kernel(MlaAttentionParams p) {
  static_assert(SG == kSOne || ((SG == kSRows || SG == kSDims) && NT == 2), "two S groups");
  constexpr int kSW = s_group_count(SG) * kSWarps;  // S warps
  constexpr int kRows = 8 * NT;
  extern __shared__ __align__(128) char smem[];
  // p.early_kv: each role waits itself (its first reads of the previous kernel's output), PV
  // warp 0 after copying the stages of old keys (pv_warps); the metadata is the step's upload.
  if (!p.early_kv) {
    pdl_wait();
    pdl_trigger();
  }
  mla::BlockWork w;
  if (!w.init(p, kRows)) return;
  WaitProfile<PROF> prof;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int NS = p.stages;
  const StageLayout lay(p.fmt.row_bytes, row_group_log2(p.row_groups, p.page_size));
  const uint32_t smem_s = smem_addr(smem);
  const Block b{w,
                warp,
                lane,
                lane / 4,
                lane % 4,
                NS,
                lay,
                lay.group_log2 != 0,
                lay.group_rows(),
                lay.stage_bytes(),
                smem,
                smem_s,
                smem_s + KindTraits<LK, CVT>::kStages0,
                w.nchunks};
  if (tid == 0) {
    for (int s = 0; s < NS; ++s) {
      mla::mbar_init(smem_s + kFullOff + 8 * s, 1);  // the producer's arrival
      // One arrival per PV warp (V tile: per S warp, of every group).
      mla::mbar_init(smem_s + kEmptyOff + 8 * s, KindTraits<LK, CVT>::kVT ? kSW : kPvWarps);
    }
    mla::mbar_init_fence();
  }
  __syncthreads();
  if (warp < kSW)
    s_warps<SG == kSRows ? 1 : NT, LK, CVT, PROF, SG>(p, b, prof);
  else
    pv_warps<NT, LK, CVT, PROF, SG>(p, b, prof);
  if (p.merge_counters != nullptr) merge_if_last<kRows, block_threads(SG)>(p, w, smem);
}

}  // namespace strata::cuda::mla_decode
