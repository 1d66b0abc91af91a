// A grid-wide barrier for kernels whose whole grid is resident at once (at most one CTA an SM,
// the grid at most the SM count, the launch only where the occupancy query holds it), and the
// acquire load and clock it waits with: head_gemv_linear.cu (W_UV + o_proj in one launch) and
// bench/cuda/chain_bench.cu (--what fused).
#pragma once

#include <cstdint>

namespace strata::cuda {

__device__ __forceinline__ unsigned ld_acquire_gpu(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
  return t;
}

// Every CTA of the grid arrives once; true when all have, their global stores before the barrier
// then visible to this CTA's loads after it: CTA 0 adds 2^31 - (ctas - 1), the others 1, so the
// word's top bit flips when the last CTA arrives and its low bits return to what they were (no
// reset between barriers or launches of any grid size; head_gemv_linear.h). The bit is read
// before arriving, as it cannot flip before this CTA has (the word's previous use ended before
// this one began: a barrier earlier in the kernel, or a launch before this kernel's PDL wait
// returned), so the add is a reduction: no round trip for its old value. False after timeout_ns
// without the others: the grid is not resident at once (other work holds SMs: another process under
// MPS, another backend on this GPU), and the CTA makes the outputs itself rather than wait on CTAs
// that wait for its SM.
__device__ __forceinline__ bool grid_barrier(unsigned* word, uint64_t timeout_ns) {
  __shared__ int met;
  __syncthreads();  // the CTA's stores issued
  if (threadIdx.x == 0) {
    const unsigned add = blockIdx.x == 0 ? 0x80000000u - (gridDim.x - 1) : 1u;
    const unsigned phase = ld_acquire_gpu(word) & 0x80000000u;
    __threadfence();  // the CTA's stores, device-wide, before it counts itself in
    atomicAdd(word, add);
    const uint64_t start = global_ns();
    met = 1;
    while ((ld_acquire_gpu(word) & 0x80000000u) == phase) {
      if (global_ns() - start > timeout_ns) {
        met = 0;
        break;
      }
    }
  }
  __syncthreads();
  return met != 0;
}

}  // namespace strata::cuda
