// Paged KV write: each new token's K and V rows go to its slot (page · page_size + offset) of a
// layer's caches in one launch, divided by the layer's scales and stored as the layer's element
// type: bf16, or fp8 e4m3 / e5m2 rounded exactly as the CPU reference rounds (fp8.cuh), so the
// two backends store the same bytes for the same bf16 inputs.
#include "backend/cuda/common.cuh"
#include "backend/cuda/fp8.cuh"

namespace strata::cuda {
namespace {

template <int E>
__device__ __forceinline__ void store_elem(void* base, int64_t i, float v) {
  if constexpr (E == kKvBf16) static_cast<bf16_bits*>(base)[i] = float_to_bf16(v);
  else if constexpr (E == kKvE4M3) static_cast<uint8_t*>(base)[i] = float_to_e4m3(v);
  else static_cast<uint8_t*>(base)[i] = float_to_e5m2(v);
}

template <int E>
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
    store_elem<E>(p.cache_k, slot * p.k_dim + c, v);
  } else {
    const int d = c - p.k_dim;
    float v = bf16_to_float(p.src_v[t * p.v_dim + d]);
    if (p.inv_scale_v != 1.0f) v *= p.inv_scale_v;
    store_elem<E>(p.cache_v, slot * p.v_dim + d, v);
  }
}

// Eight values per thread when rows are 16-byte aligned and the scales are 1 (a pure bf16 copy).
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
    *reinterpret_cast<uint4*>(static_cast<bf16_bits*>(p.cache_k) + slot * p.k_dim + c * 8) =
        *reinterpret_cast<const uint4*>(p.src_k + t * p.k_dim + c * 8);
  } else {
    const int d = (c - kc) * 8;
    *reinterpret_cast<uint4*>(static_cast<bf16_bits*>(p.cache_v) + slot * p.v_dim + d) =
        *reinterpret_cast<const uint4*>(p.src_v + t * p.v_dim + d);
  }
}

bool aligned16(const void* p) { return uintptr_t(p) % 16 == 0; }

}  // namespace

void launch_kv_write(const KvWriteParams& p, cudaStream_t stream) {
  const int width = p.k_dim + p.v_dim;
  if (p.tokens * width == 0) return;
  const bool vec = p.kv_elem == kKvBf16 && p.inv_scale_k == 1.0f && p.inv_scale_v == 1.0f &&
                   p.k_dim % 8 == 0 && p.v_dim % 8 == 0 && aligned16(p.src_k) &&
                   aligned16(p.cache_k) &&
                   (p.v_dim == 0 || (aligned16(p.src_v) && aligned16(p.cache_v)));
  const dim3 grid(unsigned(ceil_div(p.tokens * width, 256)));
  if (vec) {
    launch_pdl(kv_write_vec_kernel, dim3(unsigned(ceil_div(p.tokens * (width / 8), 128))), dim3(128),
               0, stream, p);
  } else if (p.kv_elem == kKvE4M3) {
    launch_pdl(kv_write_kernel<kKvE4M3>, grid, dim3(256), 0, stream, p);
  } else if (p.kv_elem == kKvE5M2) {
    launch_pdl(kv_write_kernel<kKvE5M2>, grid, dim3(256), 0, stream, p);
  } else {
    launch_pdl(kv_write_kernel<kKvBf16>, grid, dim3(256), 0, stream, p);
  }
}

}  // namespace strata::cuda
