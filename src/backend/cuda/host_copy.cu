// Gather/scatter copy of KV pages between the device pool and mapped pinned host memory: one
// block per (page, layer K|V part); the threads of a block stream the part in 16-byte vectors,
// four loads in flight per thread, which keeps enough PCIe reads outstanding to approach the
// link's bandwidth without one cudaMemcpyAsync per page run.
#include "backend/cuda/host_copy.h"
#include "backend/cuda/launch.h"

namespace strata::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;

__global__ void kv_page_copy_kernel(const KvCopySegment* segments, const int2* copies,
                                    int num_copies, bool to_host, bool vec16) {
  const KvCopySegment s = segments[blockIdx.y];
  for (int c = blockIdx.x; c < num_copies; c += gridDim.x) {
    const int2 cp = copies[c];
    char* dev = s.device + int64_t(cp.x) * s.page_bytes;
    char* host = s.host + int64_t(cp.y) * s.page_bytes;
    const char* src = to_host ? dev : host;
    char* dst = to_host ? host : dev;
    if (vec16) {
      const uint4* in = reinterpret_cast<const uint4*>(src);
      uint4* out = reinterpret_cast<uint4*>(dst);
      const int64_t n = s.page_bytes / 16;
      for (int64_t base = 0; base < n; base += int64_t(kThreads) * kUnroll) {
        uint4 v[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int64_t i = base + u * kThreads + threadIdx.x;
          if (i < n) v[u] = in[i];
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int64_t i = base + u * kThreads + threadIdx.x;
          if (i < n) out[i] = v[u];
        }
      }
    } else {
      for (int64_t i = threadIdx.x; i < s.page_bytes; i += kThreads) dst[i] = src[i];
    }
  }
}

}  // namespace

void launch_kv_page_copy(const KvCopySegment* segments, int num_segments, const int32_t* copies,
                         int num_copies, bool to_host, bool vec16, cudaStream_t stream) {
  if (num_copies <= 0 || num_segments <= 0) return;
  const dim3 grid(unsigned(num_copies < (1 << 20) ? num_copies : (1 << 20)),
                  unsigned(num_segments));
  kv_page_copy_kernel<<<grid, kThreads, 0, stream>>>(
      segments, reinterpret_cast<const int2*>(copies), num_copies, to_host, vec16);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace strata::cuda
