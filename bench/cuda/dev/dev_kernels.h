// Development kernels of the CUDA backend: variants measured against the product's kernels and
// not used by the product (bench/RESULTS.md has their numbers). They build as the library
// strata_cuda_dev, used by llama_bench and by their parity tests (dev_parity_test.cc,
// strata_dev_parity_test); a backend runs them through CudaBackend::set_dev_kernels.
//   - the tensor-core GEMV for decode batches of 1..64 rows (gemv_mma.cu): slower than the FMA
//     GEMV at m <= 2 and than cuBLAS at m >= 4 on the 8B shape (RESULTS "tensor-core GEMV");
//   - prefill attention variants of head_dim 64/128 (prefill_variants.cu): the mma.sync kernel
//     (prefill_mma.cu) and the wgmma kernel's configurations the product does not run.
#pragma once

#include "backend/cuda/attention.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/linear.h"

namespace strata::cuda::dev {

// ---- the tensor-core GEMV (gemv_mma.cu) ----
// The same GEMV as linear.h's (plain or GLU, GemvParams, the same roundings) on the tensor
// cores for up to kGemvMmaMaxRows rows: mma.sync with 16 weight rows per tile, the rows of x as
// up to 8 n-tiles of 8 tokens; weights streamed once with 16-byte loads; any m >= 1, k % 8 == 0,
// 16-byte aligned rows.
constexpr int kGemvMmaMaxRows = 64;
using GemvLauncher = void (*)(const GemvParams&, const Launch&);
// Its launcher with a k split that gives every SM `warps_per_sm` warps (1, 2, 4, 8, 16, 24 or
// 48; 24 was its default) and `unroll8` 32-element k chunks per weight batch in the 8-n-tile
// kernels, m > 32 (4, its default, or 2).
GemvLauncher gemv_mma(int warps_per_sm = 24, int unroll8 = 4);
// DevKernels that send linear / linear_silu_mul of min_rows..max_rows rows to gemv_mma (the
// product sent 2..64 rows to it when it was enabled).
DevKernels gemv_mma_kernels(int min_rows = 2, int max_rows = kGemvMmaMaxRows,
                            int warps_per_sm = 24);

// ---- prefill attention variants (prefill_variants.cu) ----
// For head_dim 64/128 (grouped rows: CudaBackend's tile list): mma.sync (prefill_mma.cu), or
// wgmma with 64- or 128-key tiles, 2 or 3 (s3) K/V stages, or P·V one tile behind (ov). The
// product runs wgmma64s3 for bf16 KV at head_dim 64 and wgmma64 otherwise.
enum class PrefillVariant : int {
  kMma = 0,
  kWgmma64 = 1,
  kWgmma128 = 2,
  kWgmma64S3 = 3,
  kWgmma128S3 = 4,
  kWgmma128Ov = 5
};
inline constexpr PrefillVariant kPrefillVariants[] = {
    PrefillVariant::kMma,       PrefillVariant::kWgmma64,    PrefillVariant::kWgmma128,
    PrefillVariant::kWgmma64S3, PrefillVariant::kWgmma128S3, PrefillVariant::kWgmma128Ov};
const char* prefill_variant_name(PrefillVariant v);
// DevKernels whose prefill attention runs variant `v` for head_dim 64/128 (the product's kernel
// for other head sizes). Sets the variants' shared-memory limits on the current device.
DevKernels prefill_variant_kernels(PrefillVariant v);

}  // namespace strata::cuda::dev
