// y = x · Wᵀ + b through OpenBLAS sgemm.
#include <cblas.h>

#include "backend/cpu/cpu_backend.h"

namespace strata::cpu {

void CpuBackend::linear(const Tensor& x, const LinearWeight& w, const Tensor& out) {
  const Tensor& wt = w.weight->view();
  const int64_t m = x.numel() / x.dim(-1), k = x.dim(-1), n = wt.dim(0);
  CHECK_MSG(wt.dim(1) == k, "linear: x has {} features, weight {}", k, shape_str(wt.shape));
  CHECK_EQ(out.numel(), m * n);
  if (m == 0) return;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(m), int(n), int(k), 1.0f,
              x.ptr<float>(), int(k), wt.ptr<float>(), int(k), 0.0f, out.ptr<float>(), int(n));
  if (w.bias) {
    const float* b = w.bias->view().ptr<float>();
    float* po = out.ptr<float>();
    for (int64_t r = 0; r < m; ++r)
      for (int64_t j = 0; j < n; ++j) po[r * n + j] += b[j];
  }
}

}  // namespace strata::cpu
