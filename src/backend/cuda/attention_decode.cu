// Paged decode attention (one new token per sequence), GQA-aware and split-KV, on tensor cores.
//
// Grid (splits, kv_heads, seqs); 4 warps. A block walks its split of one sequence's context for
// one KV head in chunks of 64 tokens. Each chunk's K and V rows are gathered from the page table
// into shared memory with cp.async (16-byte pieces; every row is read once per KV head and serves
// all `group` query heads), kStages chunks in flight, so loads of the next chunks overlap the math
// of this one. The group's query heads are the rows of one 16-row mma.sync m16n8k16 tile (rows
// >= group are zero): warp w takes tokens [16w, 16w + 16) of each chunk, S = Q·Kᵀ and O += P·V on
// bf16 tensor cores with float32 accumulation, one online-softmax update per warp and chunk (the
// fragment layouts are the prefill kernel's). The 4 warps' states merge in shared memory at the
// end. With fp8 K/V (e4m3, e5m2) the mma runs in f16: fragments are widened exactly as they are
// read; the K scale multiplies the scores, the V scale the output. With several splits each block
// writes an unnormalized partial (o, max, sum) and combine_kernel merges them; the grid depends
// only on the split count, never on the lengths, so a decode step replays as a CUDA graph.
#include <cfloat>

#include "backend/cuda/attention.h"
#include "backend/cuda/attention_decode_rope.cuh"
#include "backend/cuda/attention_mma.cuh"
#include "backend/cuda/attention_tile.cuh"
#include "backend/cuda/common.cuh"
#include "backend/cuda/fp8.cuh"

namespace strata::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kChunk = 64;  // tokens per pipeline stage (16 per warp)
constexpr int kStages = 3;
constexpr int kRows = 8;  // query heads a block serves (the mma tile's first 8 rows)

// The K/V stages and slot table (attention_tile.cuh) while the chunks run, then the warps' merge.
template <int D, int E>
struct Tile : attn::PagedKvLayout<D, E, kChunk, kStages, kThreads> {
  using Base = attn::PagedKvLayout<D, E, kChunk, kStages, kThreads>;
  static constexpr int kMergeBytes = kWarps * kRows * (D + 2) * 4;
  static constexpr int kSmemBytes = Base::kLoopBytes > kMergeBytes ? Base::kLoopBytes : kMergeBytes;
};

template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

using attn::column_pair;
using attn::mma_kv;
using attn::pair_at;

// Two floats as the mma's input pair (bf16 or f16). Not shared with the split-KV prefill kernel,
// which packs bf16 with one cvt.rn.bf16x2 (the same values, other instructions).
template <int E>
__device__ __forceinline__ uint32_t pack_in(float lo, float hi) {
  if constexpr (E == kKvBf16) {
    return pack2(lo, hi);
  } else {
    const __half2 h = __floats2half2_rn(lo, hi);
    uint32_t u;
    std::memcpy(&u, &h, 4);
    return u;
  }
}

// The kernel's instances (each its own: one's registers leave the others' occupancy as it was):
// kPlainKv; kEarlyKv (p.early_kv); kRopeKv (p.rope.qkv: Q and the new K/V rows from the QKV
// projection's output, attention_decode_rope.cuh; with the early copies).
enum DecodeMode { kPlainKv, kEarlyKv, kRopeKv };

template <int D, int E, int MODE>
__global__ void __launch_bounds__(kThreads) decode_kernel(AttentionParams p) {
  constexpr bool EARLY = MODE != kPlainKv, ROPE = MODE == kRopeKv;
  using T = Tile<D, E>;
  extern __shared__ __align__(16) char smem[];

  if constexpr (!EARLY) pdl_enter(p.pdl_early);  // EARLY: after the first chunks' copies (below)
  const int split = blockIdx.x, kvh = blockIdx.y, s = blockIdx.z;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int gr = lane / 4, gc = (lane % 4) * 2;
  const int group = p.heads / p.kv_heads;
  const int len = p.meta.kv_lens[s];
  const int row = p.meta.q_indptr[s];
  const int begin = split * p.split_len;
  const int end = min(len, begin + p.split_len);
  const int nchunks = end > begin ? (end - begin + kChunk - 1) / kChunk : 0;

  // The split's K/V rows, gathered through the page table (attention_tile.cuh).
  const attn::PagedKvGather<T, D> kv{smem,
                                     reinterpret_cast<int32_t*>(smem + T::kSlotOff),
                                     p.meta.page_indices + p.meta.page_indptr[s],
                                     p.meta.page_size,
                                     begin,
                                     end,
                                     int64_t(p.kv_heads) * D,
                                     kvh,
                                     static_cast<const char*>(p.k_cache),
                                     static_cast<const char*>(p.v_cache),
                                     tid};
  // EARLY: the first chunks' copies go out before the PDL wait, all but the new token's
  // row (key len - 1, which the previous kernel writes: zero-filled by the early copy), which
  // threads tid < 2 kPieces load after the wait (nrow: K pieces, then V) and store over the
  // zeros once its chunk has landed (iteration cn of the loop). The metadata and the page table
  // are the step's inputs, staged before its kernels; the other keys are earlier steps'.
  // ROPE: the new row in whichever chunk, made from the projection's output (and stored into
  // the cache) by those threads; no copy reads its slot. Its copies go out before the wait only
  // with p.early_kv: before it the kernel is the QKV projection itself, which streams weights.
  const int kn = len - 1;
  const int cn = EARLY && kn >= begin && kn < end && (ROPE || (kn - begin) / kChunk < kStages - 1)
                     ? (kn - begin) / kChunk
                     : -1;
  uint4 nrow = make_uint4(0, 0, 0, 0);
  uint32_t qraw[D / 16][2];                                  // ROPE: Q's pairs before the rotation
  __shared__ float2 rope_cs[ROPE ? kMaxDecodeRopeHalf : 1];  // ROPE: the token's rotations
  if constexpr (ROPE) {
    attn::rope_table(p, row, rope_cs);
    __syncthreads();
  }
  if constexpr (EARLY) {
    const bool late = ROPE && !p.early_kv;
    if (late) pdl_enter(p.pdl_early);
    kv.fill_table(cn >= 0 ? kn : -1);
    kv.issue_first(nchunks);
    if (!late) {
      pdl_wait();
      pdl_trigger();
    }
    if constexpr (ROPE) {  // every load of the projection's output before any store
      attn::load_q_pairs<D>(p, row, kvh * group + gr, gr < group, gc, qraw);
      if (cn >= 0 && tid < 2 * T::kPieces) {
        const int piece = tid % T::kPieces;
        const bool is_k = tid < T::kPieces;
        const attn::NewKvInput<E> in = attn::load_new_kv_piece<D, E>(p, row, kvh, piece, is_k);
        nrow = attn::new_kv_piece<D, E>(p, rope_cs, row, kvh, piece, is_k, in);
      }
    } else if (cn >= 0 && tid < 2 * T::kPieces) {
      nrow = __ldcg(reinterpret_cast<const uint4*>(
          (tid < T::kPieces ? kv.kc : kv.vc) +
          (int64_t(kv.slot_of(kn)) * kv.kdim + int64_t(kvh) * D) * T::kEb +
          (tid % T::kPieces) * 16));
    }
  } else {
    kv.start(nchunks);
  }

  // Q as the A operand: row gr is query head gr of the group (zero past the group); rows 8..15
  // are always zero. bf16 pairs first (ROPE: rotated from the projection's output), then, for
  // fp8 caches, widened to the f16 mma's pairs.
  uint32_t qa[D / 16][2];
  if constexpr (ROPE) {
    attn::rotated_q<D>(p, rope_cs, row, kvh * group + gr, gr < group, gc, split == 0, qraw, qa);
  } else {
    const bf16_bits* qrow = p.q + (int64_t(row) * p.heads + kvh * group + gr) * D;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        qa[kk][h] =
            gr < group ? *reinterpret_cast<const uint32_t*>(qrow + kk * 16 + gc + 8 * h) : 0u;
  }
  if constexpr (E != kKvBf16)
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        qa[kk][h] =
            pack_in<E>(__uint_as_float(qa[kk][h] << 16), __uint_as_float(qa[kk][h] & 0xffff0000u));
  const float qk_scale = p.scale_log2 * p.k_scale;
  // ldmatrix row addresses (bytes) of this lane in a warp's 16-token slice (bf16 caches).
  const uint32_t k_lane =
      uint32_t(((lane >> 4) * 8 + (lane & 7)) * T::kStride + ((lane >> 3) & 1) * 16);
  const uint32_t v_lane =
      uint32_t((((lane >> 3) & 1) * 8 + (lane & 7)) * T::kStride + (lane >> 4) * 16);
  float o[D / 8][2];
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt) o[dt][0] = o[dt][1] = 0.0f;
  float m = -INFINITY, l = 0.0f;  // row gr's running max and (this lane's part of the) sum

  for (int c = 0; c < nchunks; ++c) {
    cp_async_wait<kStages - 2>();
    __syncthreads();         // chunk c landed; everyone is done with chunk c - 1's buffers
    if (EARLY && c == cn) {  // the new token's row over its zeros (block-uniform)
      if (tid < 2 * T::kPieces)
        *reinterpret_cast<uint4*>(
            smem + (c % kStages) * T::kStageBytes + (tid < T::kPieces ? 0 : kChunk * T::kStride) +
            (kn - begin - c * kChunk) * T::kStride + (tid % T::kPieces) * 16) = nrow;
      __syncthreads();
    }
    if (c + kStages - 1 < nchunks) kv.load_chunk(c + kStages - 1);
    attn::cp_async_commit();
    // Page lookup of chunk c + kStages, stored at the end of this iteration (latency hidden).
    const int jn = begin + (c + kStages) * kChunk + tid;
    int next_slot = -1;
    if (tid < kChunk && jn < end && (!ROPE || jn != kn)) next_slot = kv.slot_of(jn);
    const char* kb = smem + (c % kStages) * T::kStageBytes + warp * 16 * T::kStride;
    const char* vb = kb + kChunk * T::kStride;
    const int valid = min(16, end - (begin + c * kChunk + warp * 16));  // may be <= 0

    float sc[2][4] = {{0, 0, 0, 0}, {0, 0, 0, 0}};
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const uint32_t a[4] = {qa[kk][0], 0u, qa[kk][1], 0u};
      if constexpr (E == kKvBf16) {  // both 8-token tiles' fragments in one ldmatrix
        uint32_t b[4];
        attn::ldmatrix_x4(b, smem_addr(kb) + k_lane + kk * 32);
        mma_kv<E>(sc[0], a, b[0], b[1]);
        mma_kv<E>(sc[1], a, b[2], b[3]);
      } else {
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          const char* kr = kb + (nt * 8 + gr) * T::kStride;
          mma_kv<E>(sc[nt], a, pair_at<E>(kr, kk * 16 + gc), pair_at<E>(kr, kk * 16 + gc + 8));
        }
      }
    }
    float mx = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int t = nt * 8 + gc + e;
        sc[nt][e] = t < valid ? sc[nt][e] * qk_scale : -INFINITY;
        mx = fmaxf(mx, sc[nt][e]);
      }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float mn = fmaxf(m, mx);
    const float ref = mn == -INFINITY ? 0.0f : mn;  // nothing seen yet: exp2 gives 0, not NaN
    const float corr = exp2f(m - ref);
    m = mn;
    float rs = 0.0f;
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        sc[nt][e] = exp2f(sc[nt][e] - ref);
        rs += sc[nt][e];
      }
    l = l * corr + rs;
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
      o[dt][0] *= corr;
      o[dt][1] *= corr;
    }
    // P (row gr; rows 8..15 zero) · V[16 tokens][D].
    const uint32_t a[4] = {pack_in<E>(sc[0][0], sc[0][1]), 0u, pack_in<E>(sc[1][0], sc[1][1]), 0u};
    if constexpr (E == kKvBf16) {  // two 8-column tiles' fragments per ldmatrix.trans
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t b[4];
        attn::ldmatrix_x4_trans(b, smem_addr(vb) + v_lane + dp * 32);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float acc[4] = {o[2 * dp + h][0], o[2 * dp + h][1], 0.0f, 0.0f};
          mma_kv<E>(acc, a, b[2 * h], b[2 * h + 1]);
          o[2 * dp + h][0] = acc[0];
          o[2 * dp + h][1] = acc[1];
        }
      }
    }
    const char* v0 = vb + gc * T::kStride;
#pragma unroll
    for (int dt = 0; dt < (E == kKvBf16 ? 0 : D / 8); ++dt) {
      const int col = dt * 8 + gr;
      const uint32_t b0 = column_pair<E>(v0, v0 + T::kStride, col);
      const uint32_t b1 = column_pair<E>(v0 + 8 * T::kStride, v0 + 9 * T::kStride, col);
      float acc[4] = {o[dt][0], o[dt][1], 0.0f, 0.0f};
      mma_kv<E>(acc, a, b0, b1);
      o[dt][0] = acc[0];
      o[dt][1] = acc[1];
    }
    // Stage c % kStages of the table was last read copying chunk c (two iterations ago) and is
    // next read copying chunk c + kStages (next iteration, after its barrier).
    if (tid < kChunk) kv.slots[(c % kStages) * kChunk + tid] = next_slot;
  }
  cp_async_wait<0>();
  __syncthreads();  // the stage buffers are free: merge the warps' states there

  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);
  float* mo = reinterpret_cast<float*>(smem);  // [kWarps][kRows][D] o, then [kWarps][kRows] m, l
  float* mm = mo + kWarps * kRows * D;
  float* ml = mm + kWarps * kRows;
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt) {
    mo[(warp * kRows + gr) * D + dt * 8 + gc] = o[dt][0];
    mo[(warp * kRows + gr) * D + dt * 8 + gc + 1] = o[dt][1];
  }
  if (gc == 0) {
    mm[warp * kRows + gr] = m;
    ml[warp * kRows + gr] = l;
  }
  __syncthreads();
  for (int idx = tid; idx < group * D; idx += kThreads) {
    const int g = idx / D, d = idx % D;
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, mm[w * kRows + g]);
    float sum = 0.0f, acc = 0.0f;
    if (mx != -INFINITY) {
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const float wt = exp2f(mm[w * kRows + g] - mx);
        sum += ml[w * kRows + g] * wt;
        acc += mo[(w * kRows + g) * D + d] * wt;
      }
    }
    const int h = kvh * group + g;
    if (p.num_splits == 1) {
      p.out[(int64_t(row) * p.heads + h) * D + d] = float_to_bf16(acc / sum * p.v_scale);
    } else {
      const int64_t at = (int64_t(s) * p.heads + h) * p.num_splits + split;
      p.partial_o[at * D + d] = acc;
      if (d == 0) {
        p.partial_ml[at * 2] = mx;
        p.partial_ml[at * 2 + 1] = sum;
      }
    }
  }
}

// Merges the splits of one (sequence, head): blockDim = head_dim. The splits' (max, sum) pairs
// are staged in shared memory first, so the per-split loop has no dependent global loads.
__global__ void combine_kernel(AttentionParams p) {
  pdl_enter(p.pdl_early);
  extern __shared__ float sm[];  // [num_splits] max, then [num_splits] weight
  float* sm_m = sm;
  float* sm_w = sm + p.num_splits;
  const int sh = blockIdx.x;  // s · heads + h
  const int s = sh / p.heads, h = sh % p.heads, d = threadIdx.x;
  const float* ml = p.partial_ml + int64_t(sh) * p.num_splits * 2;
  for (int i = d; i < p.num_splits; i += blockDim.x) {
    sm_m[i] = ml[2 * i];
    sm_w[i] = ml[2 * i + 1];
  }
  __syncthreads();
  float mx = -INFINITY;
  for (int i = 0; i < p.num_splits; ++i) mx = fmaxf(mx, sm_m[i]);
  float sum = 0, o = 0;
  const float* po = p.partial_o + int64_t(sh) * p.num_splits * p.head_dim + d;
#pragma unroll 8
  for (int i = 0; i < p.num_splits; ++i) {
    const float w = sm_m[i] == -INFINITY ? 0.0f : exp2f(sm_m[i] - mx);  // empty split: 0
    sum += sm_w[i] * w;
    o += po[int64_t(i) * p.head_dim] * w;
  }
  const int row = p.meta.q_indptr[s];
  p.out[(int64_t(row) * p.heads + h) * p.head_dim + d] = float_to_bf16(o / sum * p.v_scale);
}

// The ROPE instance for head sizes 32, 64, 128 (attention_decode_rope.cuh's neox pieces need
// D / 2 >= 16).
template <int D>
constexpr bool kRopeFusable = D >= 32;

template <int D, int E>
void launch_de(const AttentionParams& p, const Launch& launch) {
  const dim3 grid(p.num_splits, p.kv_heads, p.meta.num_seqs);
  const size_t smem = size_t(Tile<D, E>::kSmemBytes);
  if (p.rope.qkv != nullptr) {
    CHECK_MSG(kRopeFusable<D>, "decode attention: rope fusion at head_dim {}", D);
    if constexpr (kRopeFusable<D>)
      launch_pdl(decode_kernel<D, E, kRopeKv>, grid, dim3(kThreads), smem, launch, p);
  } else if (p.early_kv) {
    launch_pdl(decode_kernel<D, E, kEarlyKv>, grid, dim3(kThreads), smem, launch, p);
  } else {
    launch_pdl(decode_kernel<D, E, kPlainKv>, grid, dim3(kThreads), smem, launch, p);
  }
  CUDA_LAUNCH_CHECK();
}

template <int D>
void launch_d(const AttentionParams& p, const Launch& launch) {
  if (p.kv_elem == kKvE4M3)
    launch_de<D, kKvE4M3>(p, launch);
  else if (p.kv_elem == kKvE5M2)
    launch_de<D, kKvE5M2>(p, launch);
  else
    launch_de<D, kKvBf16>(p, launch);
}

template <int D, int E>
void set_limits_de() {
  for (auto* k : {decode_kernel<D, E, kPlainKv>, decode_kernel<D, E, kEarlyKv>})
    CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    Tile<D, E>::kSmemBytes));
  if constexpr (kRopeFusable<D>)
    CUDA_CHECK(cudaFuncSetAttribute(decode_kernel<D, E, kRopeKv>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    Tile<D, E>::kSmemBytes));
}

template <int D>
void set_limits_d() {
  set_limits_de<D, kKvBf16>();
  set_limits_de<D, kKvE4M3>();
  set_limits_de<D, kKvE5M2>();
}

}  // namespace

bool decode_attention_supported(int head_dim, int group) {
  return (head_dim == 16 || head_dim == 32 || head_dim == 64 || head_dim == 128) && group >= 1 &&
         group <= kRows;
}

int decode_tokens_per_iteration(int head_dim) { return kChunk; }

void init_decode_attention_kernels() {
  set_limits_d<16>();
  set_limits_d<32>();
  set_limits_d<64>();
  set_limits_d<128>();
}

void launch_decode_attention(const AttentionParams& p, const Launch& launch) {
  if (p.meta.num_seqs == 0) return;
  switch (p.head_dim) {
    case 16:
      launch_d<16>(p, launch);
      break;
    case 32:
      launch_d<32>(p, launch);
      break;
    case 64:
      launch_d<64>(p, launch);
      break;
    case 128:
      launch_d<128>(p, launch);
      break;
    default:
      CHECK_MSG(false, "decode attention: head_dim {}", p.head_dim);
  }
  if (p.num_splits > 1) {
    launch_pdl(combine_kernel, dim3(unsigned(p.meta.num_seqs * p.heads)), dim3(p.head_dim),
               size_t(p.num_splits) * 2 * sizeof(float), launch, p);
    CUDA_LAUNCH_CHECK();
  }
}

}  // namespace strata::cuda
