// Element-wise and copy kernels of the CUDA backend: f32 -> bf16 conversion (uploads), add,
// SwiGLU (silu_mul), row/column copies (embedding, gather_rows, slice_columns, copy_columns) and
// the bias epilogue of cuBLAS GEMMs. All memory-bound; float math, bf16 storage.
#include <algorithm>
#include <cstdlib>

#include "backend/cuda/common.cuh"

namespace strata::cuda {
namespace {

constexpr int kThreads = 256;

int grid_for(int64_t n) { return int(std::min<int64_t>(ceil_div(n, kThreads), 1 << 20)); }

__global__ void f32_to_bf16_kernel(ConvertParams p) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < p.n;
       i += int64_t(gridDim.x) * blockDim.x)
    p.dst[i] = float_to_bf16(p.src[i]);
}

__global__ void fill_random_kernel(bf16_bits* dst, int64_t n, uint64_t seed, float scale) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    uint64_t z = seed + uint64_t(i) * 0x9E3779B97F4A7C15ull;  // splitmix64
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const float u = float(z >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    dst[i] = float_to_bf16((2.0f * u - 1.0f) * scale);
  }
}

__global__ void add_kernel(AddParams p) {
  pdl_wait();
  pdl_trigger();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < p.n;
       i += int64_t(gridDim.x) * blockDim.x)
    p.out[i] = float_to_bf16(bf16_to_float(p.a[i]) + bf16_to_float(p.b[i]));
}

__global__ void silu_mul_kernel(SiluMulParams p) {
  pdl_wait();
  pdl_trigger();
  const int64_t n = p.rows * p.inter;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / p.inter, c = i - r * p.inter;
    const float g = bf16_to_float(p.x[r * 2 * p.inter + c]);
    const float u = bf16_to_float(p.x[r * 2 * p.inter + p.inter + c]);
    p.out[i] = float_to_bf16(g / (1.0f + __expf(-g)) * u);
  }
}

// Eight bf16 at a time when the whole job is 16-byte aligned (the common case).
__global__ void silu_mul_vec_kernel(SiluMulParams p) {
  pdl_wait();
  pdl_trigger();
  const int64_t per_row = p.inter / 8, n = p.rows * per_row;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / per_row, c = (i - r * per_row) * 8;
    const uint4 gv = *reinterpret_cast<const uint4*>(p.x + r * 2 * p.inter + c);
    const uint4 uv = *reinterpret_cast<const uint4*>(p.x + r * 2 * p.inter + p.inter + c);
    float g[8], u[8], o[8];
    unpack8(gv, g);
    unpack8(uv, u);
#pragma unroll
    for (int j = 0; j < 8; ++j) o[j] = g[j] / (1.0f + __expf(-g[j])) * u[j];
    *reinterpret_cast<uint4*>(p.out + r * p.inter + c) = pack8(o);
  }
}

template <typename T>
__global__ void copy_rows_kernel(CopyRowsParams p) {
  pdl_wait();
  pdl_trigger();
  const int64_t n = p.n * p.width;
  const T* x = static_cast<const T*>(p.x);
  T* out = static_cast<T*>(p.out);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / p.width, c = i - r * p.width;
    const int64_t src_row = p.rows ? p.rows[r] : r;
    out[r * p.out_stride + p.out_begin + c] = x[src_row * p.x_stride + p.x_begin + c];
  }
}

template <typename T>
__global__ void multi_slice_kernel(MultiSliceParams p) {
  pdl_wait();
  pdl_trigger();
  const int seg = blockIdx.y;
  const int64_t width = p.width[seg], n = p.n * width;
  const T* x = static_cast<const T*>(p.x) + p.x_begin[seg];
  T* out = static_cast<T*>(p.out[seg]);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / width, c = i - r * width;
    out[i] = x[r * p.x_stride + c];
  }
}

__global__ void bias_add_kernel(BiasAddParams p) {
  pdl_wait();
  pdl_trigger();
  const int64_t n = p.rows * p.cols;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    p.out[i] = float_to_bf16(bf16_to_float(p.out[i]) + p.bias[i % p.cols]);
}

}  // namespace

namespace {
bool& pdl_flag() {
  static bool on = [] {
    const char* v = std::getenv("STRATA_CUDA_PDL");
    return !(v && v[0] == '0');
  }();
  return on;
}
}  // namespace

bool pdl_enabled() { return pdl_flag(); }
void set_pdl_enabled(bool on) { pdl_flag() = on; }

void launch_f32_to_bf16(const ConvertParams& p, cudaStream_t stream) {
  if (p.n == 0) return;
  f32_to_bf16_kernel<<<grid_for(p.n), kThreads, 0, stream>>>(p);
  CUDA_LAUNCH_CHECK();
}

void launch_fill_random_bf16(bf16_bits* dst, int64_t n, uint64_t seed, float scale,
                             cudaStream_t stream) {
  if (n == 0) return;
  fill_random_kernel<<<grid_for(n), kThreads, 0, stream>>>(dst, n, seed, scale);
  CUDA_LAUNCH_CHECK();
}

void launch_add(const AddParams& p, cudaStream_t stream) {
  if (p.n == 0) return;
  launch_pdl(add_kernel, grid_for(p.n), kThreads, 0, stream, p);
  CUDA_LAUNCH_CHECK();
}

void launch_silu_mul(const SiluMulParams& p, cudaStream_t stream) {
  if (p.rows * p.inter == 0) return;
  const bool vec = p.inter % 8 == 0 && (uintptr_t(p.x) % 16) == 0 && (uintptr_t(p.out) % 16) == 0;
  if (vec) {
    launch_pdl(silu_mul_vec_kernel, grid_for(p.rows * p.inter / 8), kThreads, 0, stream, p);
  } else {
    launch_pdl(silu_mul_kernel, grid_for(p.rows * p.inter), kThreads, 0, stream, p);
  }
  CUDA_LAUNCH_CHECK();
}

void launch_copy_rows(const CopyRowsParams& p, cudaStream_t stream) {
  if (p.n * p.width == 0) return;
  // Widen the element to 16 bytes when every offset and stride allows it.
  CopyRowsParams q = p;
  for (int wide : {16, 8, 4}) {
    if (wide <= p.elem_bytes) break;
    const int f = wide / p.elem_bytes;
    if (p.x_stride % f == 0 && p.out_stride % f == 0 && p.x_begin % f == 0 &&
        p.out_begin % f == 0 && p.width % f == 0 && uintptr_t(p.x) % wide == 0 &&
        uintptr_t(p.out) % wide == 0) {
      q.x_stride /= f;
      q.out_stride /= f;
      q.x_begin /= f;
      q.out_begin /= f;
      q.width /= f;
      q.elem_bytes = wide;
      break;
    }
  }
  const int grid = grid_for(q.n * q.width);
  switch (q.elem_bytes) {
    case 16: launch_pdl(copy_rows_kernel<uint4>, grid, kThreads, 0, stream, q); break;
    case 8: launch_pdl(copy_rows_kernel<uint2>, grid, kThreads, 0, stream, q); break;
    case 4: launch_pdl(copy_rows_kernel<uint32_t>, grid, kThreads, 0, stream, q); break;
    case 2: launch_pdl(copy_rows_kernel<uint16_t>, grid, kThreads, 0, stream, q); break;
    case 1: launch_pdl(copy_rows_kernel<uint8_t>, grid, kThreads, 0, stream, q); break;
    default: CHECK_MSG(false, "copy_rows: element of {} bytes", q.elem_bytes);
  }
  CUDA_LAUNCH_CHECK();
}

void launch_multi_slice(const MultiSliceParams& p, cudaStream_t stream) {
  int64_t widest = 0;
  for (int i = 0; i < p.count; ++i) widest = std::max(widest, p.width[i]);
  if (p.n * widest == 0) return;
  MultiSliceParams q = p;
  // 16-byte elements when every offset allows (Q/K/V slices of head_dim multiples do).
  const int f = 16 / p.elem_bytes;
  bool wide = p.elem_bytes < 16 && p.x_stride % f == 0 && uintptr_t(p.x) % 16 == 0;
  for (int i = 0; i < p.count; ++i)
    wide = wide && p.x_begin[i] % f == 0 && p.width[i] % f == 0 && uintptr_t(p.out[i]) % 16 == 0;
  if (wide) {
    q.x_stride /= f;
    for (int i = 0; i < q.count; ++i) {
      q.x_begin[i] /= f;
      q.width[i] /= f;
    }
    q.elem_bytes = 16;
    widest /= f;
  }
  const dim3 grid(unsigned(grid_for(q.n * widest)), unsigned(q.count));
  switch (q.elem_bytes) {
    case 16: launch_pdl(multi_slice_kernel<uint4>, grid, dim3(kThreads), 0, stream, q); break;
    case 4: launch_pdl(multi_slice_kernel<uint32_t>, grid, dim3(kThreads), 0, stream, q); break;
    case 2: launch_pdl(multi_slice_kernel<uint16_t>, grid, dim3(kThreads), 0, stream, q); break;
    default: CHECK_MSG(false, "multi_slice: element of {} bytes", q.elem_bytes);
  }
}

void launch_bias_add(const BiasAddParams& p, cudaStream_t stream) {
  if (p.rows * p.cols == 0) return;
  launch_pdl(bias_add_kernel, grid_for(p.rows * p.cols), kThreads, 0, stream, p);
  CUDA_LAUNCH_CHECK();
}

}  // namespace strata::cuda
