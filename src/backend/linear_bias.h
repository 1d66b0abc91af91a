// The optional float32 bias of a linear weight, checked and uploaded the same way by every
// backend's upload_linear (the default in backend.cc and the CUDA backend's packed and bf16 paths).
#pragma once

#include <cstdint>

#include "backend/backend.h"

namespace strata {

// Null when `bias_f32` is empty (no bias); else the bias on `be`'s device, float32 [out].
// CHECK-fails on any other dtype or size, naming both.
DeviceTensorPtr upload_linear_bias(Backend& be, const Tensor& bias_f32, int64_t out);

}  // namespace strata
