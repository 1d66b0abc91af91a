// Device helpers shared by the CUDA backend's kernels: bf16 <-> float, 16-byte vectors.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "backend/cuda/launch.h"

namespace strata::cuda {

#define CUDA_LAUNCH_CHECK() CUDA_CHECK(cudaGetLastError())

__device__ __forceinline__ float bf16_to_float(bf16_bits b) {
  return __uint_as_float(uint32_t(b) << 16);
}
__device__ __forceinline__ bf16_bits float_to_bf16(float f) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}
// f rounded to the nearest bf16, kept as a float.
__device__ __forceinline__ float round_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }
// Eight bf16 values in a 16-byte vector, unpacked to floats.
__device__ __forceinline__ void unpack8(const uint4& v, float* f) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(w[i] << 16);
    f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}
// Σ a[i] · b[i] over 8 values, one fmaf chain from 0 in index order: the decode GEMVs' step
// (linear.cu) and the kernels that reproduce its sums bit for bit (mla_query.cu,
// head_gemv_linear.cu).
__device__ __forceinline__ float dot8(const float* a, const float* b) {
  float s = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) s = fmaf(a[i], b[i], s);
  return s;
}
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  return uint32_t(float_to_bf16(lo)) | (uint32_t(float_to_bf16(hi)) << 16);
}
__device__ __forceinline__ uint4 pack8(const float* f) {
  return make_uint4(pack2(f[0], f[1]), pack2(f[2], f[3]), pack2(f[4], f[5]), pack2(f[6], f[7]));
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Programmatic dependent launch (Hopper): a kernel launched with launch_pdl may start while the
// previous kernel in the stream is finishing, hiding the launch gap between the many small
// kernels of a decode step. Every such kernel calls pdl_wait() before touching memory (it
// returns once the previous grid has completed and its writes are visible; completion is then
// transitive along the stream) and pdl_trigger() to let the next kernel launch early.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;");
#endif
}
// A kernel's entry: waits on its predecessor and lets its successor launch. `early` triggers
// first, so the successor's blocks can become resident (and run their pre-wait part: a GEMV's
// weight prefetch) while this kernel still waits on its own predecessor. Safe because every
// kernel waits before touching memory that another kernel writes: a successor's wait returns
// only once this kernel, which itself waited, has completed.
__device__ __forceinline__ void pdl_enter(int early) {
  if (early) {
    pdl_trigger();
    pdl_wait();
  } else {
    pdl_wait();
    pdl_trigger();
  }
}
// The 32-bit shared-state address of `p` (a pointer into this CTA's shared memory), as PTX's
// ld.shared / cp.async / mbarrier / ldmatrix operands take it.
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return uint32_t(__cvta_generic_to_shared(p));
}
// Prefetches the 128-byte line holding `p` into L2 (no register is written).
__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}
// The most dynamic shared memory a block of `kernel` may take on the current device: the opt-in
// limit less the kernel's static shared memory (cudaFuncAttributeMaxDynamicSharedMemorySize may
// not be set above it). Host.
template <typename... KArgs>
int max_dynamic_smem(void (*kernel)(KArgs...)) {
  int dev = 0, optin = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  cudaFuncAttributes a{};
  CUDA_CHECK(cudaFuncGetAttributes(&a, kernel));
  return optin - int(a.sharedSizeBytes);
}
// Lets `kernel` take that much (once a device: PerDeviceOnce).
template <typename... KArgs>
void allow_max_dynamic_smem(void (*kernel)(KArgs...)) {
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  max_dynamic_smem(kernel)));
}
// Launches `kernel` with programmatic dependent launch when `launch.pdl` (CudaTunables::pdl), in
// thread-block clusters of `cluster` CTAs along x (1: none; grid.x a multiple of it).
template <typename... KArgs, typename... Args>
void launch_pdl_cluster(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                        const Launch& launch, int cluster, Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = launch.stream;
  cudaLaunchAttribute attr[2];
  unsigned n = 0;
  if (launch.pdl) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  if (cluster > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = unsigned(cluster);
    attr[n].val.clusterDim.y = 1;
    attr[n].val.clusterDim.z = 1;
    ++n;
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}
// The same without clusters.
template <typename... KArgs, typename... Args>
void launch_pdl(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, const Launch& launch,
                Args&&... args) {
  launch_pdl_cluster(kernel, grid, block, smem, launch, 1, std::forward<Args>(args)...);
}

}  // namespace strata::cuda
