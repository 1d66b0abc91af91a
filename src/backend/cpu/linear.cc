// y = x · Wᵀ + b on the CPU reference.
//
// Batch invariance is the point of this kernel: every output element is one dot product whose
// summation order depends only on K, never on how many rows are in the batch or which thread
// computes it. A BLAS picks different kernels for different M (gemv for one row, blocked gemm for
// many), so a request's greedy output could change with the batch it ran in. Here batched rows
// equal single rows bit for bit, which the engine's batch-invariance tests rely on.
#include <algorithm>

#include "backend/cpu/cpu_backend.h"
#include "core/thread_pool.h"

namespace strata::cpu {
namespace {

constexpr int kLanes = 8;

// Dot product with kLanes independent partial sums (vectorizable) and a fixed final tree.
inline float dot(const float* a, const float* b, int64_t k) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= k; i += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += a[i + l] * b[i + l];
  float tail = 0;
  for (; i < k; ++i) tail += a[i] * b[i];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])) + tail;
}

}  // namespace

void gemm_nt(int64_t m, int64_t n, int64_t k, const float* px, int64_t ldx, const float* pw,
             int64_t ldw, float* po, int64_t ldo, const float* bias) {
  if (m == 0 || n == 0) return;
  // Column blocks small enough to stay in L2 while every row streams past them.
  const int64_t block = std::max<int64_t>(8, (int64_t(1) << 16) / std::max<int64_t>(k, 1));
  const int64_t num_blocks = (n + block - 1) / block;
  parallel_for(num_blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t n0 = b * block, n1 = std::min(n, n0 + block);
      for (int64_t r = 0; r < m; ++r) {
        const float* xr = px + r * ldx;
        float* orow = po + r * ldo;
        for (int64_t j = n0; j < n1; ++j) orow[j] = dot(xr, pw + j * ldw, k) + (bias ? bias[j] : 0.0f);
      }
    }
  });
}

void CpuBackend::linear(const Tensor& x, const LinearWeight& w, const Tensor& out) {
  const Tensor& wt = w.weight->view();
  const int64_t m = x.numel() / x.dim(-1), k = x.dim(-1), n = wt.dim(0);
  CHECK_MSG(wt.dim(1) == k, "linear: x has {} features, weight {}", k, shape_str(wt.shape));
  CHECK_EQ(out.numel(), m * n);
  gemm_nt(m, n, k, x.ptr<float>(), k, wt.ptr<float>(), k, out.ptr<float>(), n,
          w.bias ? w.bias->view().ptr<float>() : nullptr);
}

}  // namespace strata::cpu
