// Paged KV write: each new token's K and V rows go to its slot (page · page_size + offset) of a
// layer's caches in one launch, divided by the layer's scales and stored as the layer's element
// type: bf16, or fp8 e4m3 / e5m2 rounded exactly as the CPU reference rounds (fp8.cuh), so the
// two backends store the same bytes for the same bf16 inputs. MLA layouts (rope_dim > 0: the
// latent rows, split or FlashMLA formats included) go to the MLA writer (mla.cu).
#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/fp8.cuh"
#include "backend/cuda/kv_write.h"

namespace strata::cuda {
namespace {

template <int E>
__device__ __forceinline__ void store_elem(void* base, int64_t i, float v) {
  if constexpr (E == kKvBf16)
    static_cast<bf16_bits*>(base)[i] = float_to_bf16(v);
  else if constexpr (E == kKvE4M3)
    static_cast<uint8_t*>(base)[i] = float_to_e4m3(v);
  else
    static_cast<uint8_t*>(base)[i] = float_to_e5m2(v);
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

void launch_kv_write(const KvWriteParams& p, const Launch& launch) {
  const int width = p.k_dim + p.v_dim;
  if (p.tokens * width == 0) return;
  const bool vec = p.kv_elem == kKvBf16 && p.inv_scale_k == 1.0f && p.inv_scale_v == 1.0f &&
                   p.k_dim % 8 == 0 && p.v_dim % 8 == 0 && aligned16(p.src_k) &&
                   aligned16(p.cache_k) &&
                   (p.v_dim == 0 || (aligned16(p.src_v) && aligned16(p.cache_v)));
  const dim3 grid(unsigned(ceil_div(p.tokens * width, 256)));
  if (vec) {
    launch_pdl(kv_write_vec_kernel, dim3(unsigned(ceil_div(p.tokens * (width / 8), 128))),
               dim3(128), 0, launch, p);
  } else if (p.kv_elem == kKvE4M3) {
    launch_pdl(kv_write_kernel<kKvE4M3>, grid, dim3(256), 0, launch, p);
  } else if (p.kv_elem == kKvE5M2) {
    launch_pdl(kv_write_kernel<kKvE5M2>, grid, dim3(256), 0, launch, p);
  } else {
    launch_pdl(kv_write_kernel<kKvBf16>, grid, dim3(256), 0, launch, p);
  }
}

// ---- host entries ----
int kv_elem_of(const Tensor& cache) {
  switch (cache.dtype) {
    case DType::kBF16:
      return kKvBf16;
    case DType::kFP8E4M3:
      return kKvE4M3;
    case DType::kFP8E5M2:
      return kKvE5M2;
    default:
      CHECK_MSG(false, "CUDA KV cache of dtype {}", dtype_name(cache.dtype));
  }
  return kKvBf16;
}

void CudaBackend::kv_write(KvStorage& kv, int layer, const Tensor& k, const Tensor& v,
                           const AttentionMetadata& meta) {
  const KvLayout& lay = kv.layout();
  CHECK_EQ(k.numel(), int64_t(meta.num_tokens) * lay.k_dim);
  for (int t = 0; t < meta.num_tokens; ++t) {
    const int64_t slot = meta.slot_mapping[t];
    CHECK_MSG(slot >= 0 && slot < lay.num_pages * lay.page_size, "slot {} out of pool", slot);
  }
  if (meta.num_tokens == 0) return;
  check_bf16(k, "kv_write k");
  // MLA rows (latent + rope part, every row format of backend/kv_format.h): mla.cu.
  if (lay.rope_dim > 0) {
    mla_kv_write(kv, layer, k, meta);
    return;
  }
  const DeviceMeta& dm = device_meta(meta);
  auto p = zeroed<KvWriteParams>();
  p.src_k = k.ptr<bf16_bits>();
  p.cache_k = kv.k(layer).data;
  p.kv_elem = kv_elem_of(kv.k(layer));
  p.slots = dm.slot_mapping;
  p.tokens = meta.num_tokens;
  p.k_dim = lay.k_dim;
  // 1 / scale in float, as the CPU reference computes it (backend/kv_format.cc).
  p.inv_scale_k = 1.0f / kv.k_scale(layer);
  p.inv_scale_v = 1.0f;
  if (lay.v_dim > 0) {
    check_bf16(v, "kv_write v");
    CHECK_EQ(v.numel(), int64_t(meta.num_tokens) * lay.v_dim);
    p.src_v = v.ptr<bf16_bits>();
    p.cache_v = kv.v(layer).data;
    p.v_dim = lay.v_dim;
    p.inv_scale_v = 1.0f / kv.v_scale(layer);
  }
  record(kOpKvWrite, p, launch_kv_write);
}

}  // namespace strata::cuda
