// Paged KV write: each new token's K and V rows go to its slot (page · page_size + offset) of a
// layer's bf16 caches, divided by the layer's scales, in one launch. fp8 KV is not implemented.
#include "backend/cuda/common.cuh"

namespace strata::cuda {
namespace {

__global__ void kv_write_kernel(KvWriteParams p) {
  pdl_wait();
  pdl_trigger();
  const int width = p.k_dim + p.v_dim;
  const int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (idx >= p.tokens * width) return;
  const int64_t t = idx / width;
  const int c = int(idx - t * width);
  const int64_t slot = p.slots[t];
  if (c < p.k_dim) {
    float v = bf16_to_float(p.src_k[t * p.k_dim + c]);
    if (p.inv_scale_k != 1.0f) v *= p.inv_scale_k;
    p.cache_k[slot * p.k_dim + c] = float_to_bf16(v);
  } else {
    const int d = c - p.k_dim;
    float v = bf16_to_float(p.src_v[t * p.v_dim + d]);
    if (p.inv_scale_v != 1.0f) v *= p.inv_scale_v;
    p.cache_v[slot * p.v_dim + d] = float_to_bf16(v);
  }
}

// Eight values per thread when rows are 16-byte aligned and the scales are 1 (a pure copy).
__global__ void kv_write_vec_kernel(KvWriteParams p) {
  pdl_wait();
  pdl_trigger();
  const int kc = p.k_dim / 8, width = kc + p.v_dim / 8;
  const int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (idx >= p.tokens * width) return;
  const int64_t t = idx / width;
  const int c = int(idx - t * width);
  const int64_t slot = p.slots[t];
  if (c < kc) {
    *reinterpret_cast<uint4*>(p.cache_k + slot * p.k_dim + c * 8) =
        *reinterpret_cast<const uint4*>(p.src_k + t * p.k_dim + c * 8);
  } else {
    const int d = (c - kc) * 8;
    *reinterpret_cast<uint4*>(p.cache_v + slot * p.v_dim + d) =
        *reinterpret_cast<const uint4*>(p.src_v + t * p.v_dim + d);
  }
}

bool aligned16(const void* p) { return uintptr_t(p) % 16 == 0; }

}  // namespace

void launch_kv_write(const KvWriteParams& p, cudaStream_t stream) {
  const int width = p.k_dim + p.v_dim;
  if (p.tokens * width == 0) return;
  const bool vec = p.inv_scale_k == 1.0f && p.inv_scale_v == 1.0f && p.k_dim % 8 == 0 &&
                   p.v_dim % 8 == 0 && aligned16(p.src_k) && aligned16(p.cache_k) &&
                   (p.v_dim == 0 || (aligned16(p.src_v) && aligned16(p.cache_v)));
  if (vec) {
    launch_pdl(kv_write_vec_kernel, dim3(unsigned(ceil_div(p.tokens * (width / 8), 128))), dim3(128),
               0, stream, p);
  } else {
    launch_pdl(kv_write_kernel, dim3(unsigned(ceil_div(p.tokens * width, 256))), dim3(256), 0,
               stream, p);
  }
}

}  // namespace strata::cuda
