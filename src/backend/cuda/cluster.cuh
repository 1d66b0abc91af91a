// Thread-block clusters (sm_90): a CTA's rank in its cluster, the cluster barrier, and loads and
// stores to another CTA's shared memory (distributed shared memory). Kernels that split one
// output's k over a cluster (moe_experts_gemv_kernel.cuh, moe_experts_int4_gate_up.cu) add the
// CTAs' partial sums through these in a fixed rank order: nothing is accumulated atomically.
#pragma once

#include <cstdint>

namespace strata::cuda {

__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
// Every thread of every CTA of the cluster arrives; shared-memory writes before it are visible to
// the cluster after it.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.aligned;\nbarrier.cluster.wait.aligned;\n" ::: "memory");
}
// This CTA's shared address `a` as the same offset in cluster CTA `rank`'s shared memory.
__device__ __forceinline__ uint32_t cluster_map(uint32_t a, uint32_t rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(a), "r"(rank));
  return r;
}
__device__ __forceinline__ void st_cluster(uint32_t addr, float v) {
  asm volatile("st.shared::cluster.f32 [%0], %1;\n" ::"r"(addr), "f"(v) : "memory");
}
__device__ __forceinline__ float ld_cluster(uint32_t addr) {
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(addr) : "memory");
  return v;
}

}  // namespace strata::cuda
