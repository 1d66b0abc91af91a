// What a device backend is made with: typed options, set once at creation (the CUDA backend
// copies them into its CudaTunables).
#pragma once

#include <memory>

namespace strata {

class Backend;

struct BackendOptions {
  // Batch-invariant kernels (--enable-deterministic-inference, SGLang's flag): every op gives a
  // token's row the same bits whatever the batch it is in, its place there and the prefill
  // chunking, at a cost in throughput (CUDA: CudaTunables::deterministic). The CPU reference is
  // batch-invariant already and takes no options.
  bool deterministic = false;
};

#ifdef STRATA_CUDA
// make_cuda_backend (backend.h) with options.
std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& options);
#endif

}  // namespace strata
