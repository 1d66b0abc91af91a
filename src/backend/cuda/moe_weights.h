// How the CUDA backend keeps a MoE layer's routed experts (a stacked LinearWeight, stack =
// experts): in the layout the MoE kernels read (moe_experts.h), at exactly the bytes the
// planner counts (core/weight_format.h linear_device_bytes), so no second copy is ever held.
//
//   int4  linear_int4's tiled layout, repacked expert by expert at upload as for any linear:
//         experts one after the other, which is the MoE kernels' layout already.
//   fp8   values in the MoE 16 x 32 tiles (launch_moe_repack at upload; n · k bytes when
//         k % 32 == 0), scales: each expert's checkpoint table [ceil(n/128), ceil(k/128)] dense
//         at the start of a slot of ceil(n/128) · fp8_gemm_scale_ld(k) floats (the slot a dense
//         fp8 linear's padded table takes: the planner's figure; the tail of a slot is unused).
//   bf16  the MoE 16 x 16 tiles (launch_moe_repack at upload; 2 · n · k bytes).
//
// A stacked weight is tiled when moe_stack_tiled says so; the rule depends only on what a
// LinearWeight records (format, stack, dims, bias), so upload, moe_experts and the CPU twin's
// dequantization (CudaBackend::dequantize_bf16) agree without a flag. Stacks the kernels refuse
// (more than kMoeMaxExperts experts, n % 16 != 0, ...) stay row-major like any linear and
// moe_experts runs them on the CPU twin, counted.
#pragma once

#include <cstdint>

#include "backend/backend.h"
#include "backend/cuda/moe_experts.h"

namespace strata::cuda {

// Whether a stacked weight of `device_format` (the format the CUDA backend keeps: int4 / fp8
// block / dense bf16) lives in the MoE kernels' layout. Why not, into *why (may be null).
bool moe_stack_tiled(const LinearFormat& device_format, int64_t stack, int64_t n, int64_t k,
                     bool has_bias, const char** why = nullptr);
// A LinearWeight is tiled only if upload_linear made it (out > 0): a stack assembled by hand
// from upload() is row-major.
inline bool moe_stack_tiled(const LinearWeight& w, const char** why = nullptr) {
  if (w.weight == nullptr || w.out <= 0) {
    if (why) *why = "expert weights not made by upload_linear (row-major)";
    return false;
  }
  return moe_stack_tiled(w.format, w.stack, w.out, w.in, w.bias != nullptr, why);
}
// Floats between two experts' fp8 scale tables (the slot above).
int64_t moe_fp8_scale_slot(int64_t n, int64_t k);
// The kernels' view of a tiled stacked weight (moe_stack_tiled(w) must hold).
MoeWeights moe_weights_of(const LinearWeight& w);

}  // namespace strata::cuda
