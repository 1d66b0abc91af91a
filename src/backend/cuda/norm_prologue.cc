// Graph mode's merge of an rms_norm into the decode GEMV that reads its output
// (CudaTunables::gemv_norm_fusion; the device side: norm_prologue.cuh).
//
// Why: at batch 1 each kernel boundary costs a few microseconds of a latency-bound step, and
// MLA's q_a -> norm -> q_b (arch/deepseek.cc) is on its critical path. Every block of the
// reading kernel repeats the norm of its m <= 2 rows (k <= 8,192 values: a few KB from L2), so
// the norm's launch goes and the kernel's own weight stream starts as before. Not add_rms_norms
// (norm_prologue.cuh says why).
#include <cstdint>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/norm.h"

namespace strata::cuda {

// True when the launch just recorded is an rms_norm (not add_rms_norm) whose output is x [m, k]
// exactly: contiguous rows, m <= 2, not in place (the reading kernel's blocks read the norm's
// input while block 0 stores its output), the one-pass vec kernel's shape (the prologue follows
// its order of sums: 256 < k <= 8,192, 16-byte aligned), none of its tensors overlapping each
// other or the reader's output `out` (out_bytes). *n then holds the prologue; the caller drops
// the norm's launch and records the merged one.
bool CudaBackend::take_norm_prologue(const void* x, int64_t m, int64_t k, const void* out,
                                     int64_t out_bytes, NormPrologue* n) const {
  if (!tunables_.fusion || !tunables_.gemv_norm_fusion || m < 1 || m > 2) return false;
  RmsNormParams np;
  if (!recorder_.last(kOpRmsNorm, &np)) return false;
  if (np.out != x || np.rows != m || (np.row_stride != 0 && np.row_stride != np.dim) ||
      np.dim != k || rms_norm_kernel_for(np) != RmsNormKernel::kVecOnePass)
    return false;
  if (np.residual != nullptr) return false;
  const int64_t x_bytes = m * k * 2;
  if (byte_ranges_overlap(np.x, x_bytes, out, out_bytes) ||
      byte_ranges_overlap(np.out, x_bytes, out, out_bytes) ||
      byte_ranges_overlap(np.x, x_bytes, np.out, x_bytes))
    return false;
  *n = zeroed<NormPrologue>();
  n->x = np.x;
  n->weight = np.weight;
  n->eps = np.eps;
  n->weight_f32 = np.weight_f32;
  return true;
}

// A GEMV (plain or SwiGLU; a pair merges later, merge_gemv_pair) takes the norm as its prologue.
bool CudaBackend::merge_gemv_norm(GemvParams* p) const {
  if (p->w2 != nullptr || p->norm.x != nullptr) return false;
  const int64_t out_bytes = int64_t(p->m) * (p->glu_inter > 0 ? p->glu_inter : p->n) * 2;
  return take_norm_prologue(p->x, p->m, p->k, p->out, out_bytes, &p->norm);
}

}  // namespace strata::cuda
