// What every file of the CUDA backend shares on the host side: CUDA_CHECK, bf16 as bits, and
// Launch (where and how a launch runs).
//
// Conventions of the op families (one .cu and a small .h each: attention.h, linear.h, norm.h,
// ...): each op's launch parameters are one trivially copyable struct, declared in its family's
// header next to its launcher `void launch_x(const XParams&, const Launch&)`. The backend
// records a launch as the struct's bytes (graph_recorder.h), so in graph mode the bytes of a
// step's launches are its signature and a captured graph replays only when every launch would be
// identical: launch tunables the kernels read travel in the structs, never in globals.
// Activations and weights are bf16 (uint16_t bits here, __nv_bfloat16 in kernels); float32
// accumulation everywhere; row-major [rows, cols]. Launchers are asynchronous on the launch's
// stream and check the launch (CUDA_CHECK on cudaGetLastError).
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "core/check.h"

#define CUDA_CHECK(expr)                                                              \
  do {                                                                                \
    const cudaError_t err_ = (expr);                                                  \
    CHECK_MSG(err_ == cudaSuccess, "CUDA: {} ({})", cudaGetErrorString(err_), #expr); \
  } while (0)

namespace strata::cuda {

using bf16_bits = uint16_t;

// Where a launch runs and the attributes it is launched with (not kernel parameters: a graph
// captures them with the launch, and changing them drops the captured graphs).
struct Launch {
  cudaStream_t stream = nullptr;
  // Programmatic dependent launch of the decode-path kernels (common.cuh launch_pdl;
  // CudaTunables::pdl).
  bool pdl = true;
};

// The SM count of the device current at the first call (the launchers size their grids by it;
// every rank's GPU is of one kind), read once.
inline int num_sms() {
  static const int sms = [] {
    int dev = 0, n = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    return n;
  }();
  return sms;
}

// Runs a setup once on each device (0..63), the first time a launcher needs it there: kernel
// attributes such as the dynamic shared-memory limit are per device. For the launchers that set
// theirs lazily rather than from the backend's constructor (tests and benchmarks call them
// directly), as a function-local static: `static PerDeviceOnce limits; limits.run(init_x);`.
// Two threads may both run a setup the first time; setting an attribute twice is harmless.
class PerDeviceOnce {
 public:
  void run(void (*setup)()) {
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    const uint64_t bit = uint64_t(1) << (dev & 63);
    if ((done_.load(std::memory_order_acquire) & bit) != 0) return;
    setup();
    done_.fetch_or(bit, std::memory_order_acq_rel);
  }

 private:
  std::atomic<uint64_t> done_{0};
};

}  // namespace strata::cuda
