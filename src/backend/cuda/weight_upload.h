// Host -> device copies of weights at load time, through pinned staging.
//
// A cudaMemcpy from pageable memory makes the driver copy the bytes into its own pinned buffers
// on the calling thread, chunk after chunk, and runs at a fraction of the bus rate. Here two
// pinned buffers alternate: the host thread pool copies the next chunk into one while the copy
// engine drains the other, so the host copy (spread over the cores) and the DMA overlap.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace strata::cuda {

class PinnedUploader {
 public:
  // Two pinned buffers of `buffer_bytes` each, allocated at the first copy.
  explicit PinnedUploader(size_t buffer_bytes = size_t(64) << 20) : buffer_bytes_(buffer_bytes) {}
  ~PinnedUploader();
  PinnedUploader(const PinnedUploader&) = delete;
  PinnedUploader& operator=(const PinnedUploader&) = delete;

  // Queues device dst[0, bytes) = host src[0, bytes) on `stream`. Returns once `src` has been read
  // (the caller may free or reuse it); the device copy completes in stream order.
  void copy(void* dst, const void* src, size_t bytes, cudaStream_t stream);

 private:
  struct Slot {
    char* host = nullptr;
    cudaEvent_t drained = nullptr;  // recorded after the DMA out of `host`
  };
  size_t buffer_bytes_;
  Slot slots_[2];
  int next_ = 0;
};

}  // namespace strata::cuda
