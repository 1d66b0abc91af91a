#include "backend/cuda/weight_upload.h"

#include <algorithm>
#include <cstring>

#include "backend/cuda/launch.h"
#include "core/thread_pool.h"

namespace strata::cuda {

PinnedUploader::~PinnedUploader() {
  for (Slot& s : slots_) {
    if (s.drained) {
      cudaEventSynchronize(s.drained);
      cudaEventDestroy(s.drained);
    }
    if (s.host) cudaFreeHost(s.host);
  }
}

void PinnedUploader::copy(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return;
  if (slots_[0].host == nullptr)
    for (Slot& s : slots_) {
      CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&s.host), buffer_bytes_));
      CUDA_CHECK(cudaEventCreateWithFlags(&s.drained, cudaEventDisableTiming));
    }
  const char* from = static_cast<const char*>(src);
  char* to = static_cast<char*>(dst);
  for (size_t at = 0; at < bytes; at += buffer_bytes_) {
    const size_t n = std::min(buffer_bytes_, bytes - at);
    Slot& s = slots_[next_];
    next_ ^= 1;
    CUDA_CHECK(cudaEventSynchronize(s.drained));  // its last DMA is done: free to refill
    parallel_for(int64_t(n), int64_t(1) << 20, [&](int64_t b, int64_t e) {
      std::memcpy(s.host + b, from + at + size_t(b), size_t(e - b));
    });
    CUDA_CHECK(cudaMemcpyAsync(to + at, s.host, n, cudaMemcpyHostToDevice, stream));
    CUDA_CHECK(cudaEventRecord(s.drained, stream));
  }
}

}  // namespace strata::cuda
