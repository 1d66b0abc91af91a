// Backend::prefetch's hints (l2_prefetch.h says why): kept, within CudaTunables::
// l2_prefetch_bytes and kL2PrefetchMaxRanges in the order given (the caller's priority), until
// the next fused MLA query or per-head GEMV carries them (mla_query.cu, linear.cu) or the step
// ends (end_step drops them).
#include <cstdint>

#include "backend/cuda/cuda_backend.h"

namespace strata::cuda {

void CudaBackend::prefetch(const Tensor& t) {
  const int64_t budget = tunables_.l2_prefetch_bytes;
  if (budget <= 0 || !tunables_.fusion || t.data == nullptr || uintptr_t(t.data) % 16 != 0) return;
  const int64_t bytes = t.nbytes() / 16 * 16;  // below 2 GB: the device cuts it in 32 bits
  if (bytes <= 0 || bytes >= (int64_t(1) << 31) || l2_hints_.count == kL2PrefetchMaxRanges ||
      l2_hint_bytes_ + bytes > budget)
    return;
  l2_hints_.ptr[l2_hints_.count] = static_cast<const char*>(t.data);
  l2_hints_.bytes[l2_hints_.count] = bytes;
  ++l2_hints_.count;
  l2_hint_bytes_ += bytes;
}

L2PrefetchRanges CudaBackend::take_l2_prefetch() {
  const L2PrefetchRanges taken = l2_hints_;
  l2_hints_ = zeroed<L2PrefetchRanges>();
  l2_hint_bytes_ = 0;
  return taken;
}

}  // namespace strata::cuda
