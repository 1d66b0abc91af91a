// The device side of l2_prefetch.h: one thread of each of a launch's CTAs issues its share.
#pragma once

#include <cstdint>

#include "backend/cuda/bulk_copy.cuh"
#include "backend/cuda/l2_prefetch.h"

namespace strata::cuda {

// CTA `cta` of `ctas`: slice `cta` of every range (ranges cut in 16-byte multiples), in bulk
// prefetches of at most 64 KB. One thread calls it. 32-bit arithmetic (a range is below 2 GB:
// CudaBackend::prefetch): a 64-bit division is a call with a stack frame.
__device__ __forceinline__ void l2_prefetch_share(const L2PrefetchRanges& r, uint32_t cta,
                                                  uint32_t ctas) {
  constexpr uint32_t kChunk = 64 * 1024;
#pragma unroll  // constant indices: the ranges stay in the parameter bank
  for (int i = 0; i < kL2PrefetchMaxRanges; ++i) {
    if (i >= r.count) break;
    const uint32_t bytes = uint32_t(r.bytes[i]), slice = ((bytes + ctas - 1) / ctas + 15) / 16 * 16;
    const uint32_t begin = cta * slice, end = begin + slice < bytes ? begin + slice : bytes;
    for (uint32_t at = begin; at < end; at += kChunk)
      bulk_prefetch_l2(r.ptr[i] + at, end - at < kChunk ? end - at : kChunk);
  }
}

}  // namespace strata::cuda
