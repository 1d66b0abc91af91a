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

}  // namespace strata::cuda
