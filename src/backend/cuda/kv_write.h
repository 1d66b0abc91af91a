// Paged KV write (kv_write.cu): the new tokens' K and V rows into their cache slots.
#pragma once

#include "backend/cuda/launch.h"
#include "core/tensor.h"

namespace strata::cuda {

struct KvWriteParams {     // K and V rows of the new tokens in one launch
  const bf16_bits* src_k;  // [tokens, k_dim]
  const bf16_bits* src_v;  // [tokens, v_dim] (v_dim may be 0)
  void* cache_k;           // [num_slots, k_dim] of kv_elem
  void* cache_v;           // [num_slots, v_dim] of kv_elem
  const int32_t* slots;    // device [tokens]
  int64_t tokens;
  int k_dim;
  int v_dim;
  float inv_scale_k;  // stored = value · inv_scale (1 / the layer's scale, as on the CPU)
  float inv_scale_v;
  int kv_elem;  // KvElem (fp8.cuh): bf16, fp8 e4m3 or fp8 e5m2
  int pad_;
};
void launch_kv_write(const KvWriteParams& p, const Launch& launch);

// The kernels' element code (fp8.cuh KvElem) of a KV cache tensor (CudaKvStorage holds bf16 and
// fp8 layers only).
int kv_elem_of(const Tensor& cache);

}  // namespace strata::cuda
