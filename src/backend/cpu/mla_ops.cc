// Column copies and per-head linear maps of the CPU reference backend: the pieces of absorbed
// MLA attention (arch/mla.h) that are not plain linear layers.

#include <cstring>

#include "backend/cpu/cpu_backend.h"

namespace strata::cpu {

void CpuBackend::copy_columns(const Tensor& x, int64_t begin, int64_t end, const Tensor& out,
                              int64_t out_begin) {
  const int64_t cx = x.dim(-1), co = out.dim(-1), rows = x.numel() / cx, w = end - begin;
  CHECK(0 <= begin && begin <= end && end <= cx);
  CHECK(0 <= out_begin && out_begin + w <= co);
  CHECK_EQ(out.numel() / co, rows);
  const float* px = x.ptr<float>();
  float* po = out.ptr<float>();
  for (int64_t r = 0; r < rows; ++r)
    std::memmove(po + r * co + out_begin, px + r * cx + begin, size_t(w) * sizeof(float));
}

void CpuBackend::per_head_linear(const Tensor& x, int64_t x_begin, const Tensor& w,
                                 const Tensor& out, int64_t out_begin) {
  CHECK_EQ(x.rank(), 3);
  CHECK_EQ(out.rank(), 3);
  CHECK_EQ(w.rank(), 3);
  const int64_t tokens = x.dim(0), heads = x.dim(1), dx = x.dim(2), dout = out.dim(2);
  const int64_t n = w.dim(1), k = w.dim(2);
  CHECK_EQ(w.dim(0), heads);
  CHECK_EQ(out.dim(0), tokens);
  CHECK_EQ(out.dim(1), heads);
  CHECK_MSG(x_begin + k <= dx && out_begin + n <= dout,
            "per_head_linear: x {} from {}, w {}, out {} from {}", shape_str(x.shape), x_begin,
            shape_str(w.shape), shape_str(out.shape), out_begin);
  if (tokens == 0) return;
  for (int64_t h = 0; h < heads; ++h) {
    // Strided rows: token t's head h starts at (t · heads + h) · D.
    gemm_nt(tokens, n, k, x.ptr<float>() + h * dx + x_begin, heads * dx, w.ptr<float>() + h * n * k,
            k, out.ptr<float>() + h * dout + out_begin, heads * dout);
  }
}

}  // namespace strata::cpu
