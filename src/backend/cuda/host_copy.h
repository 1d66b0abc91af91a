// The gather/scatter kernel of the host KV tier's `kernel` io backend (backend/kv_host_io.h):
// copies whole KV pages between the device pool and pinned, mapped host memory in one launch.
// C++17 (included by host_copy.cu); the copier class is host_copy_io.cc.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace strata::cuda {

// One layer's K or V block: page p lives at device + p * page_bytes on the device side and at
// host + p * page_bytes in host memory (a device-visible pointer of the mapped pinned memory).
struct KvCopySegment {
  char* device = nullptr;
  char* host = nullptr;
  int64_t page_bytes = 0;
};

// For every pair (device_page, host_page) of `copies` (int32 [num_copies][2], device-readable)
// and every segment (device array [num_segments]), copies one page: device -> host when to_host,
// else host -> device. Asynchronous on `stream`.
void launch_kv_page_copy(const KvCopySegment* segments, int num_segments, const int32_t* copies,
                         int num_copies, bool to_host, bool vec16, cudaStream_t stream);

}  // namespace strata::cuda
