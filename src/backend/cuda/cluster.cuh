// Thread-block clusters (sm_90): a CTA's rank in its cluster, the cluster barrier, and loads and
// stores to another CTA's shared memory (distributed shared memory). Kernels that split one
// output's k over a cluster (moe_experts_gemv_kernel.cuh, moe_experts_int4_gate_up.cu) add the
// CTAs' partial sums through these in a fixed rank order: nothing is accumulated atomically.
#pragma once

#include <cstdint>

#include "backend/cuda/launch.h"

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
// The cluster barrier in two halves: arrive once this CTA's reads of the others' shared memory
// are done (release), wait before exiting (acquire), so work between the two overlaps the
// slowest CTA's reads.
__device__ __forceinline__ void cluster_arrive() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
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
__device__ __forceinline__ uint16_t ld_cluster_u16(uint32_t addr) {
  uint16_t v;
  asm volatile("ld.shared::cluster.u16 %0, [%1];\n" : "=h"(v) : "r"(addr) : "memory");
  return v;
}
__device__ __forceinline__ uint4 ld_cluster_v4(uint32_t addr) {  // addr 16-byte aligned
  uint4 v;
  asm volatile("ld.shared::cluster.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr)
               : "memory");
  return v;
}

// Host: the CTAs a cluster gives each of `rows` rows of `warps` warps (one value a warp summed over
// the row: cluster_sum_in_warp_order), for up to `max_rows` rows of 16 warps or more: the largest
// divisor of the warps up to 8 (the portable cluster size) that leaves each CTA 2 warps or more
// and rows x CTAs within one wave. 1: one CTA a row.
inline int row_cluster_ctas(int64_t rows, int64_t warps, int64_t max_rows) {
  if (rows > max_rows || warps < 16) return 1;
  for (int c = 8; c > 1; --c)
    if (warps % c == 0 && warps / c >= 2 && rows * c <= num_sms()) return c;
  return 1;
}

// The sum of one value a warp over the cluster's CTAs in warp order (CTA r's `warps` values
// after CTA r - 1's), as one CTA of ctas x warps warps would add them: `mine` holds this CTA's
// values (written before the call), `scratch` ctas x warps floats of this CTA's shared memory.
// Thread i < ctas x warps fetches value i (one round trip), then every thread adds the copies in
// order. Every thread of every CTA calls it (two cluster barriers; the second also keeps each
// CTA's `mine` alive until the others have read it).
__device__ __forceinline__ float cluster_sum_in_warp_order(const float* mine, int warps, int ctas,
                                                           float* scratch) {
  cluster_sync();  // every CTA's values written
  const int i = int(threadIdx.x);
  if (i < ctas * warps) {
    const uint32_t at = uint32_t(__cvta_generic_to_shared(mine + i % warps));
    scratch[i] = ld_cluster(cluster_map(at, uint32_t(i / warps)));
  }
  cluster_sync();  // the copies written; no CTA reads another's values after this
  float total = 0;
  for (int j = 0; j < ctas * warps; ++j) total += scratch[j];
  return total;
}

}  // namespace strata::cuda
