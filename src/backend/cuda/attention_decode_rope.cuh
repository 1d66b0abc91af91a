// The decode kernel's attention inputs when graph mode merged qkv_rope_kv_write into its launch
// (AttentionParams::rope, CudaTunables::decode_rope_fusion_max_seqs; attention_decode.cu's ROPE
// instance).
//
// Why: at batch 1 a Llama layer's qkv_rope launch (a few dozen blocks, ~3 us on an H100's
// critical path, 98 us of a 2.8 ms W4A16 step in session 43's timeline) only moves the QKV
// projection's output: rotate Q and K, store K and V into the cache. The decode kernel loads Q
// after its PDL wait anyway, and with its early copies of old keys (decode_early_kv) it loads the
// new token's row after the wait too: both can come from the projection's output instead,
// rotated on the way, and one launch a layer goes.
//
// Bits: every value as qkv_rope.cu makes it — the rotated pair in float32 by rope.cuh's
// rope_cos_sin and rope_rotate (its rope_pair_f32), rounded to bf16, then (cache rows) times
// 1 / scale and converted as store_kv does; so the cache, q and the attention's output are those
// of the two launches.
//
// Code size: each pair's (cos, sin) comes from a table the block makes once (rope_table), never
// from a sincosf of its own. With sincosf inlined at every pair (16 a lane for Q, 8 for a new
// row piece, each with its slow path) the ROPE instance was 7,944 SASS instructions against the
// plain one's 1,664 and its warps spent 61% of their cycles waiting on instruction fetch: 18.4 us
// alone against 7.4 + 3.9 for decode + qkv_rope (ncu, H100, 2026-12-07 session 48).
#pragma once

#include "backend/cuda/attention.h"
#include "backend/cuda/common.cuh"
#include "backend/cuda/fp8.cuh"
#include "backend/cuda/rope.cuh"

namespace strata::cuda::attn {

// cs[i]: (cos, sin) · attention_factor of pair i at the position of the block's token (row), as
// rope_cos_sin makes them. Made before the PDL wait: the positions are the step's inputs and
// inv_freq a parameter. The caller syncs the block before reading it.
__device__ __forceinline__ void rope_table(const AttentionParams& p, int row, float2* cs) {
  const DecodeRopeFusion& r = p.rope;
  const int32_t pos = p.meta.positions[row];
  for (int i = int(threadIdx.x); i < r.half; i += int(blockDim.x)) {
    float c, s;
    rope_cos_sin(pos, r.inv_freq[i], r.attention_factor, &c, &s);
    cs[i] = make_float2(c, s);
  }
}

// The loads come first, the stores after (load_q_pairs and load_new_kv_piece before
// new_kv_piece and rotated_q): a load the compiler cannot prove apart from an earlier store waits
// for it, and the store for its own load's data — two trips to L2 after the PDL wait, not one.

// Query head `head`'s bf16 pairs at columns kk·16 + gc + 8h (+ 1) of row `row` of the
// projection's output, as they are (zeros for a lane of a row past the group: !valid).
template <int D>
__device__ __forceinline__ void load_q_pairs(const AttentionParams& p, int row, int head,
                                             bool valid, int gc, uint32_t (&raw)[D / 16][2]) {
  const bf16_bits* src = p.rope.qkv + (int64_t(row) * (p.heads + 2 * p.kv_heads) + head) * D;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      raw[kk][h] =
          valid ? __ldcg(reinterpret_cast<const unsigned int*>(src + kk * 16 + gc + 8 * h)) : 0u;
}

// Those pairs (load_q_pairs) rotated, as the decode kernel's A operand; blocks of split 0 also
// write them to q_out.
template <int D>
__device__ __forceinline__ void rotated_q(const AttentionParams& p, const float2* cs, int row,
                                          int head, bool valid, int gc, bool write,
                                          const uint32_t (&raw)[D / 16][2],
                                          uint32_t (&qa)[D / 16][2]) {
  const DecodeRopeFusion& r = p.rope;
  float x[D / 16][2][2];
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      x[kk][h][0] = __uint_as_float(raw[kk][h] << 16);
      x[kk][h][1] = __uint_as_float(raw[kk][h] & 0xffff0000u);
    }
  if (r.interleaved) {  // pairs (2i, 2i + 1): this lane's two columns
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int c = kk * 16 + gc + 8 * h;
        if (c < 2 * r.half) {
          const float2 t = cs[c / 2];
          rope_rotate(x[kk][h][0], x[kk][h][1], t.x, t.y, &x[kk][h][0], &x[kk][h][1]);
        }
      }
  } else {  // neox over the whole head (the host's condition): dims c and c + D / 2, one lane
#pragma unroll
    for (int kk = 0; kk < D / 32; ++kk)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float2 t = cs[kk * 16 + gc + 8 * h + e];
          rope_rotate(x[kk][h][e], x[kk + D / 32][h][e], t.x, t.y, &x[kk][h][e],
                      &x[kk + D / 32][h][e]);
        }
  }
  bf16_bits* dst = r.q_out + (int64_t(row) * p.heads + head) * D;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t v = pack2(x[kk][h][0], x[kk][h][1]);
      qa[kk][h] = valid ? v : 0u;
      if (write && valid) *reinterpret_cast<uint32_t*>(dst + kk * 16 + gc + 8 * h) = v;
    }
}

// One element as the cache stores it (qkv_rope.cu's store_kv): v is a bf16 value.
template <int E>
__device__ __forceinline__ uint32_t cache_bits(float v, float inv_scale) {
  if (inv_scale != 1.0f) v *= inv_scale;
  if constexpr (E == kKvBf16)
    return float_to_bf16(v);
  else if constexpr (E == kKvE4M3)
    return float_to_e4m3(v);
  else
    return float_to_e5m2(v);
}

// The projection's bf16 values piece `piece` of the new token's K or V cache row is made from:
// its own kN columns and (neox K) their partners D / 2 away.
template <int E>
struct NewKvInput {
  static constexpr int kN = E == kKvBf16 ? 8 : 16;  // elements of a piece
  uint4 own[kN / 8], oth[kN / 8];
};
template <int D, int E>
__device__ __forceinline__ NewKvInput<E> load_new_kv_piece(const AttentionParams& p, int row,
                                                           int kvh, int piece, bool is_k) {
  using In = NewKvInput<E>;
  const DecodeRopeFusion& r = p.rope;
  const int head = p.heads + (is_k ? 0 : p.kv_heads) + kvh;
  const bf16_bits* src = r.qkv + (int64_t(row) * (p.heads + 2 * p.kv_heads) + head) * D;
  const int d0 = piece * In::kN;
  // Neox K: the partner piece is D / 2 away (whole pieces: D / 2 >= 16 >= kN).
  const int partner = !is_k || r.interleaved ? d0 : (d0 < D / 2 ? d0 + D / 2 : d0 - D / 2);
  In in;
#pragma unroll
  for (int i = 0; i < In::kN / 8; ++i) {
    in.own[i] = __ldcg(reinterpret_cast<const uint4*>(src + d0 + 8 * i));
    in.oth[i] =
        partner == d0 ? in.own[i] : __ldcg(reinterpret_cast<const uint4*>(src + partner + 8 * i));
  }
  return in;
}

// 16-byte piece `piece` of the new token's K (rotated) or V cache row for KV head kvh, from its
// inputs (load_new_kv_piece): stored at the token's cache slot, and returned for the kernel's
// shared-memory copy of the row.
template <int D, int E>
__device__ __forceinline__ uint4 new_kv_piece(const AttentionParams& p, const float2* cs, int row,
                                              int kvh, int piece, bool is_k,
                                              const NewKvInput<E>& in) {
  constexpr int kN = NewKvInput<E>::kN;
  const DecodeRopeFusion& r = p.rope;
  const int d0 = piece * kN;
  float own[kN], oth[kN];
#pragma unroll
  for (int i = 0; i < kN / 8; ++i) {
    unpack8(in.own[i], own + 8 * i);
    unpack8(in.oth[i], oth + 8 * i);
  }
  float out[kN];
#pragma unroll
  for (int e = 0; e < kN; ++e) {
    const int d = d0 + e;
    float r0, r1;
    if (!is_k || (r.interleaved && d >= 2 * r.half)) {
      out[e] = own[e];
    } else if (r.interleaved) {
      const float2 t = cs[d / 2];
      rope_rotate(own[e & ~1], own[e | 1], t.x, t.y, &r0, &r1);
      out[e] = round_bf16(e % 2 == 0 ? r0 : r1);
    } else if (d < D / 2) {
      const float2 t = cs[d];
      rope_rotate(own[e], oth[e], t.x, t.y, &r0, &r1);
      out[e] = round_bf16(r0);
    } else {
      const float2 t = cs[d - D / 2];
      rope_rotate(oth[e], own[e], t.x, t.y, &r0, &r1);
      out[e] = round_bf16(r1);
    }
  }
  const float inv_scale = is_k ? r.inv_scale_k : r.inv_scale_v;
  uint32_t w[4] = {0, 0, 0, 0};
#pragma unroll
  for (int e = 0; e < kN; ++e) {
    constexpr int kBits = 32 / (kN / 4);  // bits an element takes in a word
    w[e / (kN / 4)] |= cache_bits<E>(out[e], inv_scale) << (kBits * (e % (kN / 4)));
  }
  const uint4 v = make_uint4(w[0], w[1], w[2], w[3]);
  constexpr int kEb = E == kKvBf16 ? 2 : 1;
  const int64_t slot = p.meta.slot_mapping[row];
  char* cache = static_cast<char*>(is_k ? r.cache_k : r.cache_v);
  const int64_t at = (slot * p.kv_heads + kvh) * D * kEb + piece * 16;
  *reinterpret_cast<uint4*>(cache + at) = v;
  return v;
}

}  // namespace strata::cuda::attn
