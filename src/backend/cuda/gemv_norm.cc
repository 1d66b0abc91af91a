// Graph mode's merge of an RMSNorm into the decode GEMV that reads its output
// (CudaTunables::gemv_norm_fusion; the kernel's prologue: gemv_norm.cuh).
//
// Why: MLA's q path (arch/deepseek.cc) is q_a -> norm -> q_b; at batch 1 each kernel boundary
// costs a few microseconds of a latency-bound step (a Kimi-K2.5 rank: 61 norms a step on the
// critical path). Every GEMV block repeats the norm of its m <= 2 rows (k <= 8,192 values: a
// few KB from L2), so the norm's launch goes and the GEMV's own weight stream starts as before.
#include <cstdint>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/norm.h"

namespace strata::cuda {

// Merges when the launch just recorded is an rms_norm whose output is *p's x exactly: same rows
// (m <= 2, contiguous, no residual), dim = k, not in place (the GEMV's blocks read the norm's
// input while block 0 stores its output), and the one-pass vec kernel's shape (the prologue
// follows its order of sums: 256 < k <= 8,192, 16-byte aligned), for a plain GEMV (no SwiGLU,
// no pair) whose output overlaps neither.
bool CudaBackend::merge_gemv_norm(GemvParams* p) const {
  if (!tunables_.fusion || !tunables_.gemv_norm_fusion || p->m > 2 || p->glu_inter != 0 ||
      p->w2 != nullptr || p->norm_x != nullptr)
    return false;
  RmsNormParams np;
  if (!recorder_.last(kOpRmsNorm, &np)) return false;
  if (np.out != p->x || np.residual != nullptr || np.rows != p->m ||
      (np.row_stride != 0 && np.row_stride != np.dim) || np.dim != p->k ||
      rms_norm_kernel_for(np) != RmsNormKernel::kVecOnePass)
    return false;
  const int64_t x_bytes = int64_t(p->m) * p->k * 2, out_bytes = int64_t(p->m) * p->n * 2;
  if (byte_ranges_overlap(np.x, x_bytes, np.out, x_bytes) ||
      byte_ranges_overlap(np.x, x_bytes, p->out, out_bytes) ||
      byte_ranges_overlap(np.out, x_bytes, p->out, out_bytes))
    return false;
  p->norm_x = np.x;
  p->norm_w = np.weight;
  p->norm_eps = np.eps;
  p->norm_w_f32 = np.weight_f32;
  return true;
}

}  // namespace strata::cuda
