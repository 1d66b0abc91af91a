// Graph mode's merges of a dense layer's norms into its W4A16 decode GEMVs
// (CudaTunables::int4_add_norm_fusion; the device side: linear_int4_reg.cu's norm prologue and
// residual update).
//
// Why: at batch 1 a Llama layer's two add_rms_norms are single-block launches on the critical
// path between its GEMVs (o_proj -> norm -> gate_up, down -> norm -> next qkv), ~3.6 us each on an
// H100 (65 a Llama-3.1-8B W4A16 step, 2026-12-06 session 43). An add_rms_norm cannot simply move
// into the reading GEMV: every block would repeat the residual update, which writes the tensor
// the others read (session 13's form made the last block to read it store it: slower). Split:
//   - the residual update (residual = bf16(x + residual)) goes into the GEMV that made x, where
//     each output value has one owner block: merge_int4_add_norm;
//   - the rest is a plain rms_norm of the updated residual, which the next W4A16 GEMV on its
//     output runs as a prologue in every block (norm_prologue.cuh, as the bf16 GEMV's
//     gemv_norm_fusion): merge_int4_gemv_norm.
// Both keep the bits of the separate launches: the epilogue rounds out, then adds and rounds as
// the norm kernel does; the prologue follows the one-pass vec kernel's order of sums on the same
// (updated) residual values.
#include <cstdint>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/linear_int4.h"
#include "backend/cuda/norm.h"

namespace strata::cuda {

// When the launch just recorded is a plain W4A16 register GEMV (with or without a norm prologue)
// whose output is np's x [rows, dim] exactly, and no tensor the update writes overlaps one the
// GEMV reads or writes: records that GEMV again with the residual update, then np as a plain
// rms_norm of the residual. False: nothing changed.
bool CudaBackend::merge_int4_add_norm(const RmsNormParams& np) {
  if (!tunables_.fusion || !tunables_.int4_add_norm_fusion || np.residual == nullptr) return false;
  Int4LinearParams g;
  if (!recorder_.last(kOpInt4Gemv, &g) && !recorder_.last(kOpInt4GemvNorm, &g)) return false;
  if (g.residual != nullptr || g.glu_inter != 0 || np.x != g.out || np.rows != g.m ||
      np.dim != g.n || (np.row_stride != 0 && np.row_stride != np.dim) ||
      rms_norm_kernel_for(np) != RmsNormKernel::kVecOnePass)
    return false;
  const int64_t bytes = g.m * g.n * 2, x_bytes = g.m * g.k * 2;
  if (byte_ranges_overlap(np.residual, bytes, g.out, bytes) ||
      byte_ranges_overlap(np.residual, bytes, np.out, bytes) ||
      byte_ranges_overlap(np.out, bytes, g.out, bytes) ||
      byte_ranges_overlap(np.residual, bytes, g.x, x_bytes) ||
      (g.norm.x != nullptr && byte_ranges_overlap(np.residual, bytes, g.norm.x, x_bytes)))
    return false;
  RmsNormParams plain = np;
  plain.x = np.residual;
  plain.residual = nullptr;
  if (rms_norm_kernel_for(plain) != RmsNormKernel::kVecOnePass) return false;
  g.residual = np.residual;
  if (int4_gemv_auto_kernel(g) != kInt4GemvReg) return false;
  recorder_.drop_last();
  record(kOpInt4GemvAdd, g, run_int4_gemv);
  record(kOpRmsNorm, plain, launch_rms_norm);
  return true;
}

// When the launch just recorded is the rms_norm that made p's x (take_norm_prologue's
// conditions: m <= 2, the one-pass vec kernel's shape, not in place) and the register GEMV takes
// p with it: *p runs the norm as its prologue. The caller drops the norm's launch.
bool CudaBackend::merge_int4_gemv_norm(Int4LinearParams* p) const {
  if (!tunables_.int4_add_norm_fusion || p->norm.x != nullptr) return false;
  Int4LinearParams q = *p;
  const int64_t out_bytes = q.m * (q.glu_inter > 0 ? q.glu_inter : q.n) * 2;
  if (!take_norm_prologue(q.x, q.m, q.k, q.out, out_bytes, &q.norm)) return false;
  if (int4_gemv_auto_kernel(q) != kInt4GemvReg) return false;
  *p = q;
  return true;
}

}  // namespace strata::cuda
