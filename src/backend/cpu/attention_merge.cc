// The exact merge of decode context parallelism's attention partials (backend/dcp_attention.h)
// on the CPU reference: LSE weights in double, summed in part order, so the result does not
// depend on which rank's partial arrived first.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend.h"

namespace strata::cpu {

void CpuBackend::merge_attention_partials(const Tensor& parts, const Tensor& out) {
  CHECK_EQ(parts.rank(), 4);
  CHECK_EQ(out.rank(), 3);
  CHECK_EQ(int(parts.dtype), int(DType::kF32));
  const int64_t n = parts.dim(0), tokens = parts.dim(1), heads = parts.dim(2), d = parts.dim(3) - 1;
  const int64_t out_heads = out.dim(1);
  CHECK_EQ(out.dim(0), tokens);
  CHECK_EQ(out.dim(2), d);
  CHECK_LE(out_heads, heads);
  const float* p = parts.ptr<float>();
  float* o = out.ptr<float>();
  std::vector<double> weight(static_cast<size_t>(n)), acc(static_cast<size_t>(d));
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t h = 0; h < out_heads; ++h) {
      auto part = [&](int64_t k) { return p + ((k * tokens + t) * heads + h) * (d + 1); };
      double max_lse = -INFINITY;
      for (int64_t k = 0; k < n; ++k) max_lse = std::max(max_lse, double(part(k)[d]));
      float* dst = o + (t * out_heads + h) * d;
      CHECK_MSG(std::isfinite(max_lse),
                "merge_attention_partials: token {} head {} attended to nothing", t, h);
      double total = 0;
      for (int64_t k = 0; k < n; ++k) {
        const double lse = part(k)[d];
        weight[size_t(k)] = lse == -INFINITY ? 0.0 : std::exp(lse - max_lse);
        total += weight[size_t(k)];
      }
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t k = 0; k < n; ++k) {
        if (weight[size_t(k)] == 0.0) continue;
        const float* src = part(k);
        const double w = weight[size_t(k)] / total;
        for (int64_t i = 0; i < d; ++i) acc[size_t(i)] += w * double(src[i]);
      }
      for (int64_t i = 0; i < d; ++i) dst[i] = float(acc[size_t(i)]);
    }
}

}  // namespace strata::cpu
