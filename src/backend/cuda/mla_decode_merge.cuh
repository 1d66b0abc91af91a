// The split-KV merge at the end of the MLA decode kernel (mla_decode_kernel.cuh), where
// p.merge_counters is set: the last of a (sequence, row tile)'s split blocks to finish merges
// every split's partial rows, as mla_combine_kernel (mla_attention.cu) does in a launch of its
// own. Why: at batch 64 x 4,096 the bf16 rows' 2-split plan ran at 75-80% of copy bandwidth
// against 87-89% of the same kernel at batch 128 with one split (H200, 2026-12-03, mla_bench
// --what scaling); merged here, 78.5 -> 80.7% (16 heads) and 82.2 -> 83.8% (8). At batch 1 (12-64
// splits) one SM reading every split's partials is slower than the merge kernel's 32 blocks, so
// the plan uses this only up to CudaTunables::mla_fused_merge_max_splits (2).
//
// Ordering: every thread fences its partial stores, the block meets at a barrier, then one
// thread counts the block in (atomicAdd). The block that brings the count to num_splits has seen
// every other block's count, so after its own fence it reads their partials (from L2: __ldcg);
// it resets the counter to zero for the next launch (graphs replay the same counters).
#pragma once

#include "backend/cuda/mla_decode_block.cuh"

namespace strata::cuda::mla_decode {

// Shared memory of the merge, over the (then idle) first stage: the last-block flag, then the
// rows' split weights 2^(m_i - max m) and, after them, the row's latent_scale / Σ w_i l_i.
constexpr int kMergeWeightsStride = kMlaFusedMergeMaxSplits + 1;
static_assert(kMlaFusedMergeMaxSplits <= 64, "a lane weighs splits lane and lane + 32");
static_assert(16 + kMaxRows * kMergeWeightsStride * 4 <= kChunk * kR,
              "the merge's weights fit the first stage (rows of 512 bytes or more)");

// Every thread of the block (both roles done with shared memory and their stores), kRows its
// rows, THREADS the block's threads. Blocks other than a tile's last return at once.
template <int kRows, int THREADS>
__device__ __forceinline__ void merge_if_last(const MlaAttentionParams& p, const mla::BlockWork& w,
                                              char* smem) {
  static_assert(THREADS % 128 == 0 && kR == 4 * 128, "a thread a float4 of a row's 512 columns");
  constexpr int kH = THREADS / 128;  // rows at once
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  int* flag = reinterpret_cast<int*>(smem + kStageOff);
  float* wts = reinterpret_cast<float*>(smem + kStageOff + 16);
  __threadfence();  // this thread's partials, device-wide, before the block counts itself in
  __syncthreads();
  if (tid == 0) {
    int* counter = p.merge_counters + int64_t(blockIdx.z) * gridDim.x + blockIdx.x;
    const bool last = atomicAdd(counter, 1) + 1 == int(gridDim.y);
    if (last) *counter = 0;
    *flag = last;
  }
  __syncthreads();
  if (*flag == 0) return;
  __threadfence();  // the other splits' partials, counted in before the last arrival
  const int n = p.num_splits, nrows = min(w.rows - w.row0, kRows);
  const int64_t grow0 = int64_t(w.q_row0) + w.row0;
  // Weights: warp v takes rows v, v + THREADS / 32, ...; lane i splits i and i + 32.
  for (int r = warp; r < nrows; r += THREADS / 32) {
    const float2* ml = reinterpret_cast<const float2*>(p.partial_ml) + (grow0 + r) * n;
    const float2 a = lane < n ? __ldcg(ml + lane) : make_float2(-INFINITY, 0.0f);
    const float2 b = lane + 32 < n ? __ldcg(ml + lane + 32) : make_float2(-INFINITY, 0.0f);
    float mx = fmaxf(a.x, b.x);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    const float wa = a.x == -INFINITY ? 0.0f : exp2f(a.x - mx);
    const float wb = b.x == -INFINITY ? 0.0f : exp2f(b.x - mx);
    float total = wa * a.y + wb * b.y;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) total += __shfl_xor_sync(0xffffffffu, total, o);
    float* wr = wts + r * kMergeWeightsStride;
    if (lane < n) wr[lane] = wa;
    if (lane + 32 < n) wr[lane + 32] = wb;
    if (lane == 0) wr[kMlaFusedMergeMaxSplits] = total > 0.0f ? p.fmt.latent_scale / total : 0.0f;
  }
  __syncthreads();
  // Outputs: thread t the float4 at column 4 (t % 128) of rows t / 128, t / 128 + kH, ...; the
  // splits outermost, so each step has a load of every row in flight. (Each output sums the
  // splits in order whichever thread holds it: the same bits for any THREADS.)
  constexpr int kPer = (kRows + kH - 1) / kH;
  const int col = 4 * (tid % 128), h = tid / 128;
  float4 acc[kPer];
#pragma unroll
  for (int j = 0; j < kPer; ++j) acc[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 2
  for (int i = 0; i < n; ++i) {
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int r = h + kH * j;
      if (r < nrows) {
        const float wi = wts[r * kMergeWeightsStride + i];
        const float4 v =
            __ldcg(reinterpret_cast<const float4*>(p.partial_o + ((grow0 + r) * n + i) * kR + col));
        acc[j].x += wi * v.x, acc[j].y += wi * v.y, acc[j].z += wi * v.z, acc[j].w += wi * v.w;
      }
    }
  }
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int r = h + kH * j;
    if (r >= nrows) continue;
    const float inv = wts[r * kMergeWeightsStride + kMlaFusedMergeMaxSplits];
    *reinterpret_cast<uint2*>(p.out + (grow0 + r) * kR + col) = make_uint2(
        pack_bf16x2(acc[j].x * inv, acc[j].y * inv), pack_bf16x2(acc[j].z * inv, acc[j].w * inv));
  }
}

}  // namespace strata::cuda::mla_decode
