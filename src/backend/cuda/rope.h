// Rotary embedding (rope.cu) and the fused attention inputs of a QKV projection: split, rope and
// KV write in one launch (qkv_rope.cu).
#pragma once

#include "backend/cuda/launch.h"

namespace strata::cuda {

constexpr int kMaxRopeHalf = 256;
struct RopeParams {
  bf16_bits* x;   // [tokens, heads, stride]
  bf16_bits* x2;  // a second tensor rotated in the same launch (q and k), or null
  int heads2;
  int stride2;
  int offset2;  // x2's first rotated dim (MLA merges q at 128 with the cache row's rope at 512)
  int reserved_zero;         // no padding bytes: the parameters are a captured graph's signature
  const int32_t* positions;  // device [tokens]
  int64_t tokens;
  int heads;
  int stride;
  int offset;
  int half;  // rotary_dim / 2
  int interleaved;
  float attention_factor;
  float inv_freq[kMaxRopeHalf];
};
void launch_rope(const RopeParams& p, const Launch& launch);

// The attention inputs of a fused QKV projection in one launch: rope on Q (to q) and on K, K and
// V stored into the layer's KV cache (quantized as kv_write does). Neox or interleaved pairs over
// dims [0, 2 · half) of each head; dims past them are copied. Values round to bf16 after rope,
// exactly as rope then kv_write would.
struct QkvRopeParams {
  const bf16_bits* qkv;      // [tokens, (heads + 2 · kv_heads) · head_dim]
  bf16_bits* q;              // [tokens, heads, head_dim]
  void* cache_k;             // [slots, kv_heads · head_dim] of kv_elem
  void* cache_v;             // [slots, kv_heads · head_dim] of kv_elem
  const int32_t* positions;  // device [tokens]
  const int32_t* slots;      // device [tokens]
  int64_t tokens;
  int heads;
  int kv_heads;
  int head_dim;
  int half;  // rotary_dim / 2
  int interleaved;
  int kv_elem;
  int pdl_early;
  float attention_factor;
  float inv_scale_k;
  float inv_scale_v;
  float inv_freq[kMaxRopeHalf];
};
void launch_qkv_rope_kv_write(const QkvRopeParams& p, const Launch& launch);

}  // namespace strata::cuda
