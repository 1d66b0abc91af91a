// mbarriers, bulk copies by the TMA engine (cp.async.bulk) and named barriers: the pieces of the
// kernels that stream rows or weights into shared memory without a register round trip (the MLA
// decode kernel, mla_decode.cuh; the INT4 experts' split gate_up, moe_experts_int4_gate_up.cu;
// head_gemv_linear.cu, which stages weights before its PDL wait).
#pragma once

#include <cstdint>

namespace strata::cuda {

__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
// Makes initialized mbarriers visible to the async proxy (the bulk copies); a barrier follows.
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// Returns once the phase of `bar` with parity `parity` has completed (a fresh barrier counts its
// preceding phase, parity 1, as complete). Acquire: the bytes that phase's copies wrote are
// visible.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred p;\nWAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra WAIT;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Cluster scope (a barrier that another CTA of the cluster arrives on): the wait acquires what the
// other CTA released with mbar_arrive_remote; `cluster_addr` is a barrier of another CTA
// (cluster_map of this CTA's address).
__device__ __forceinline__ void mbar_wait_cluster(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred p;\nWAITC:\n"
      "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra WAITC;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void mbar_arrive_remote(uint32_t cluster_addr) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(cluster_addr)
               : "memory");
}
// One arrival that also expects `bytes` more of the current phase's copies.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
// The cp.async copies this thread issued so far arrive on `bar` when they land (the arrival
// counts against the barrier's expected count: .noinc).
__device__ __forceinline__ void cp_async_arrive_noinc(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
// `bytes` (a multiple of 16, both addresses 16-byte aligned) global -> shared by the TMA engine;
// completion counts on `bar`'s transaction bytes.
__device__ __forceinline__ void bulk_copy_g2s(uint32_t dst, const void* src, uint32_t bytes,
                                              uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::
          "r"(dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}
// The same with an L2 cache policy (l2_evict_first_policy).
__device__ __forceinline__ void bulk_copy_g2s_hint(uint32_t dst, const void* src, uint32_t bytes,
                                                   uint32_t bar, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], "
      "[%1], %2, [%3], %4;\n" ::"r"(dst),
      "l"(src), "r"(bytes), "r"(bar), "l"(policy)
      : "memory");
}
// Orders this thread's (and, after a barrier, its peers') earlier generic-proxy accesses to shared
// memory before its later async-proxy ones: a slot the warp has read may then be refilled by a
// bulk copy.
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Prefetches `bytes` (a multiple of 16, the address 16-byte aligned) from global memory into L2
// (the TMA engine; nothing waits for it, and nothing depends on it but the time of later loads).
__device__ __forceinline__ void bulk_prefetch_l2(const void* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ uint64_t l2_evict_first_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}
// One thread: `bytes` (a multiple of 16) from src into shared memory at dst by bulk copies of up
// to 32 KB, with an L2 cache policy, as one arrival on `bar` that expects their bytes (a kernel
// that stages weights before its PDL wait: head_gemv_linear.cu).
__device__ __forceinline__ void bulk_copy_into_smem(uint32_t dst, const void* src, uint32_t bytes,
                                                    uint32_t bar, uint64_t policy) {
  constexpr uint32_t kChunk = 32 * 1024;
  mbar_arrive_expect_tx(bar, bytes);
  for (uint32_t off = 0; off < bytes; off += kChunk)
    bulk_copy_g2s_hint(dst + off, static_cast<const char*>(src) + off,
                       bytes - off < kChunk ? bytes - off : kChunk, bar, policy);
}
// Named barriers: `n` threads (a multiple of 32) meet at barrier `id` (1..15; 0 is __syncthreads).
// bar_arrive does not wait; both order this thread's earlier shared-memory accesses before the
// barrier completes for the waiting threads.
__device__ __forceinline__ void named_sync(int id, int n) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int n) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}

}  // namespace strata::cuda
