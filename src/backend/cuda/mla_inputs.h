// MLA's attention inputs in one launch (mla_inputs.cu; Backend::mla_attention_inputs): the
// kv_a projection's rows become cache rows (RMSNorm of the latent, rope of the key part), q's
// rope dims are rotated (in q, and copied into q_latent's rope columns), and each cache row is
// encoded into its slot. Replaces rms_norm_columns + rope (merged q and k) + copy_columns +
// kv_write, four launches of a decode layer, with the same bits: the norm sums its squares in the
// order of the kernel launch_rms_norm would take (norm.h RmsNormKernel), the ropes share rope.cu's
// rope_pair (rope.cuh), the rows are encoded by the latent KV write's encode_row
// (mla_row_encode.cuh).
#pragma once

#include "backend/cuda/launch.h"
#include "backend/cuda/mla_attention.h"
#include "backend/cuda/rope.h"

namespace strata::cuda {

// Latent widths the fused launch takes (the vec norm layout: R / 8 threads of one block).
constexpr int kMlaInputsMaxLatent = 2048;

struct MlaInputsParams {
  bf16_bits* kv_row;         // [tokens, kv_stride]: R latent then P rope values, in place
  const void* norm;          // [R], bf16 or f32 (norm_f32)
  bf16_bits* q;              // [tokens, heads, q_stride]: dims [q_offset, q_offset + P) rotated
  bf16_bits* q_latent;       // [tokens, heads, R + P]: columns [R, R + P) written
  void* cache;               // the layer's rows [slots, fmt.row_bytes]
  const int32_t* positions;  // device [tokens]
  const int32_t* slots;      // device [tokens]: page · page_size + offset
  int64_t tokens;
  int64_t kv_stride;  // elements between two tokens' rows of kv_row (>= R + P, % 8 == 0 if vec)
  MlaRowFormat fmt;   // the slot's format; fmt.latent = R, fmt.rope = P
  int heads;
  int q_stride;  // elements per q head
  int q_offset;  // q's first rotated dim
  int norm_f32;
  int norm_vec;  // 1: launch_rms_norm's kVecOnePass order, 0: its kWarp order (R <= 256)
  int half;      // P / 2 rotated pairs
  int interleaved;
  int pdl_early;
  // 1: mla_inputs_kernel prefetches the latent norm's weights into L2 before its PDL wait
  // (parameters, never written by a kernel; CudaTunables::mla_inputs_norm_prefetch)
  int norm_prefetch;
  int pad_;  // 0 (no padding bytes)
  float eps;
  float attention_factor;
  float inv_freq[kMaxRopeHalf];
};
static_assert(sizeof(MlaInputsParams) == 9 * 8 + sizeof(MlaRowFormat) + 12 * 4 + kMaxRopeHalf * 4,
              "MlaInputsParams has no padding");
void launch_mla_inputs(const MlaInputsParams& p, const Launch& launch);

}  // namespace strata::cuda
