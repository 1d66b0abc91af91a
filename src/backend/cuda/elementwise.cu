// Element-wise kernels of the CUDA backend and their host entries (elementwise.h): add, SwiGLU
// (silu_mul), and the f32 -> bf16 conversion of uploads and the random fill of benchmarks. All
// memory-bound; float math, bf16 storage.
#include <algorithm>

#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/elementwise.h"

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

}  // namespace

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

void launch_add(const AddParams& p, const Launch& launch) {
  if (p.n == 0) return;
  launch_pdl(add_kernel, grid_for(p.n), kThreads, 0, launch, p);
  CUDA_LAUNCH_CHECK();
}

void launch_silu_mul(const SiluMulParams& p, const Launch& launch) {
  if (p.rows * p.inter == 0) return;
  const bool vec = p.inter % 8 == 0 && (uintptr_t(p.x) % 16) == 0 && (uintptr_t(p.out) % 16) == 0;
  if (vec) {
    launch_pdl(silu_mul_vec_kernel, grid_for(p.rows * p.inter / 8), kThreads, 0, launch, p);
  } else {
    launch_pdl(silu_mul_kernel, grid_for(p.rows * p.inter), kThreads, 0, launch, p);
  }
  CUDA_LAUNCH_CHECK();
}

// ---- host entries ----
void CudaBackend::add(const Tensor& a, const Tensor& b, const Tensor& out) {
  CHECK_EQ(a.numel(), b.numel());
  CHECK_EQ(out.numel(), a.numel());
  check_bf16(a, "add a");
  check_bf16(b, "add b");
  check_bf16(out, "add out");
  begin_op();
  auto p = zeroed<AddParams>();
  p.a = a.ptr<bf16_bits>();
  p.b = b.ptr<bf16_bits>();
  p.out = out.ptr<bf16_bits>();
  p.n = a.numel();
  record(kOpAdd, p, launch_add);
}

void CudaBackend::silu_mul(const Tensor& x, const Tensor& out) {
  const int64_t rows = x.dim(0), inter = out.dim(1);
  CHECK_EQ(x.dim(1), 2 * inter);
  check_bf16(x, "silu_mul x");
  check_bf16(out, "silu_mul out");
  begin_op();
  auto p = zeroed<SiluMulParams>();
  p.x = x.ptr<bf16_bits>();
  p.out = out.ptr<bf16_bits>();
  p.rows = rows;
  p.inter = inter;
  record(kOpSiluMul, p, launch_silu_mul);
}

}  // namespace strata::cuda
