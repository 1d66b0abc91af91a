// The MLA decode kernel (mla_attention.h, kernel kMlaDecode): absorbed attention of 8 or 16 query
// rows a block over R = 512 latent + P = 64 rope values of bf16, fp8 (e4m3 / e5m2, rope in bf16 or
// fp8) or FlashMLA rows, on mma.sync with a warp-specialized pipeline. The template is instantiated
// in mla_decode.cu (bf16, e5m2) and mla_decode_fp8.cu (e4m3, FlashMLA), which compile in parallel.
// Its pieces: mla_decode_layout.cuh (kinds, sizes, shared memory), mla_decode_mma.cuh (ldmatrix,
// mma, fp8 -> f16 pairs), mla_decode_block.cuh (what the warp roles share), mla_decode_s_warps.cuh
// and mla_decode_pv_warps.cuh (the two roles), mla_decode_kernel.cuh (the kernel); here its launch.
//
// Why next to the mma kernel of mla_attention.cu (which handles every shape): there all 8 warps
// issue a cp.async per 16 bytes between barriers, 3 warps compute S while 5 wait, and fp8 rows are
// decoded into a bf16 tile in shared memory with per-value branches: 62% of the copy bandwidth for
// bf16 rows and 17% for fp8 rows on an H200 (batch 64 x 4,096, 16 heads). Here:
//  - whole rows are copied with cp.async.bulk (the TMA engine) into NS stages (3 of bf16 rows, 5
//    of fp8 rows) with full / empty mbarriers, by PV warp 0 when the 4 PV warps have freed a stage
//    (its lanes' page lookups for that stage issued a chunk earlier); the other 7 warps never
//    issue loads. (A ninth, producer-only warp costs registers: ptxas sizes 288-thread blocks as
//    384, 168 a thread.) Where the page size is a multiple of 4, four consecutive slots are one
//    copy (16 a stage instead of 64: the TMA engine moves small copies below the bandwidth; or 8
//    slots, 8 copies, with row_groups 2 where the page size allows), the keys interleaved over
//    the tiles so ldmatrix stays free of bank conflicts
//    (mla_decode_layout.cuh StageLayout); and the rows of a chunk a few chunks ahead are
//    prefetched into L2 (kMlaDecodeL2Prefetch: shared memory holds only one stage in flight).
//  - 4 S warps, 16 keys of the stage each: Sᵀ = K·Qᵀ with K as the A operand (the m16 tile is 16
//    keys, each n8 tile 8 query rows, so 8 heads cost one n-tile and 16 two: no padded rows), Q in
//    registers for the whole split (36 k-steps x NT x 2 registers); the chunk's row maxima meet in
//    shared memory (a 128-thread named barrier), P goes to shared memory (two buffers);
//  - 4 PV warps, 128 output columns each: Oᵀ += Vᵀ·Pᵀ over the same stage (V = the first 512
//    columns). PV of chunk c overlaps S of chunk c + 1 (named barriers P-ready / P-free per buffer;
//    the PV warps free the stage on its empty mbarrier).
//  - fp8 values never pass through a bf16 tile in shared memory. S warps ldmatrix the raw bytes
//    (an 8x8 b16 matrix of fp8 bytes is 8 keys x 16 values, four consecutive values a lane) and
//    convert in registers; PV warps load 16 bytes of each of 4 keys, byte-permute pairs of keys
//    (__byte_perm) and convert. Both use f16 mma: every e4m3 / e5m2 value is exact in f16. Inside a
//    16-wide k-step the lanes hold their four consecutive values in a permuted k order; Q is loaded
//    in the same order, so every dot product is unchanged. Q goes to f16 with a power-of-two scale
//    per row (its largest magnitude to [2^14, 2^15): exact for every value above amax · 2^-29),
//    undone on the scores. P in f16 carries a factor 2^8 (exp2(s - m + 8)), which cancels between
//    the output and the row sum.
//  - e4m3 -> f16 by integer ops (mla::e4m3x4_to_f16x2_int: the value · 2^-8, 7 ALU ops per 4
//    values) or by the conversion unit (cvt.rn.f16x2.e4m3x2, exact, one per 2 values); Cvt picks it
//    per side (kCvtInt, kCvtHwS: S warps by the unit and PV warps by integer ops, kCvtHw), so the
//    two pipes share the work; the bench compares the three.
//  - the V tile (Cvt kCvtTile, e4m3 rows; mla_decode_layout.cuh): the S warps also store the f16
//    values they convert into a shared tile (two buffers, as P) and free the stage themselves; the
//    PV warps run the bf16 rows' ldmatrix.trans path on it with f16 mma. Each value is converted
//    once (not once in each warp role), at the cost of 128 KB of shared memory (2 stages left).
//  - FlashMLA rows: the S warps accumulate each 128-value tile separately and multiply by the key's
//    tile scale; PV warp w owns exactly tile w's columns, so it multiplies P by its tile's scale of
//    each key, divided by the chunk's largest (keeps P·s in f16's range); that divisor is carried
//    as the accumulator's scale (o_true = G · o, G the last chunk's largest).
// bench/cuda/mla_decode_emulate.py emulates this kernel lane by lane (numpy).
#pragma once

#include "backend/cuda/mla_decode_kernel.cuh"

namespace strata::cuda::mla_decode {

// Shared memory of the kernel for p's stages, rows, layout and S form (kSDims: the exchange
// after the stages).
inline int smem_bytes(const MlaAttentionParams& p) {
  const StageLayout lay(p.fmt.row_bytes, row_group_log2(p.row_groups, p.page_size));
  return kStageOff + (uses_vtile(p.fmt.latent_elem, p.cvt) ? kVTileAreaBytes : 0) +
         p.stages * lay.stage_bytes() + (p.s_groups == kSDims ? kXchgBytes : 0);
}

// p.prof set (benchmarks): the kernel with the wait profile compiled in. SG: the S warps' form
// (p.s_groups, which the caller matched to SG).
template <int NT, int LK, int CVT, int SG = 1>
void launch(const MlaAttentionParams& p, cudaStream_t stream) {
  const dim3 grid(p.row_tiles, p.num_splits, p.num_seqs), block(block_threads(SG));
  if (p.prof != nullptr)
    mla::launch(mla_decode_kernel<NT, LK, CVT, true, SG>, grid, block, size_t(smem_bytes(p)),
                stream, p);
  else
    mla::launch(mla_decode_kernel<NT, LK, CVT, false, SG>, grid, block, size_t(smem_bytes(p)),
                stream, p);
  CUDA_LAUNCH_CHECK();
}
template <int NT, int LK, int CVT, int SG = 1>
void set_limit() {
  for (auto* k :
       {mla_decode_kernel<NT, LK, CVT, false, SG>, mla_decode_kernel<NT, LK, CVT, true, SG>})
    CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, kMlaMaxSmem));
}

// The instantiation files' entry points (p.tile_rows 8 or 16 picks NT, p.cvt the conversion).
void launch_bf16(const MlaAttentionParams& p, cudaStream_t stream);
void launch_e5m2(const MlaAttentionParams& p, cudaStream_t stream);
void launch_e4m3(const MlaAttentionParams& p, cudaStream_t stream);
void launch_flash(const MlaAttentionParams& p, cudaStream_t stream);
void init_bf16_e5m2();
void init_fp8();

}  // namespace strata::cuda::mla_decode
