// y = x · Wᵀ + b on the CPU reference.
//
// Batch invariance is the point of this kernel: every output element is one dot product whose
// summation order depends only on K (simd.h's lanes + tree), never on how many rows are in the
// batch, which tile computed it or which thread. A BLAS picks different kernels for different M
// (gemv for one row, blocked gemm for many), so a request's greedy output could change with the
// batch it ran in. Here batched rows equal single rows bit for bit, which the engine's
// batch-invariance tests rely on.
//
// Speed comes from register tiles: a kRows × kCols block of outputs shares each vector load of x
// and W, so the inner loop does kRows·kCols multiply-adds per kRows + kCols loads. Each element
// still has its own lane accumulators, so the arithmetic is exactly simd.h's dot8.
#include <algorithm>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/simd.h"
#include "core/thread_pool.h"

namespace strata::cpu {
namespace {

constexpr int kRows = 4;  // rows of x per tile
constexpr int kCols = 2;  // rows of W per tile; 4×2 accumulators + 6 loads fit 16 AVX registers

// out[r][c] = x_r · w_c (+ bias[c]) for R rows of x and C rows of W.
template <int R, int C>
__attribute__((always_inline)) inline void tile(const float* x, int64_t ldx, const float* w,
                                                int64_t ldw, int64_t k, float* out, int64_t ldo,
                                                const float* bias) {
  V8 acc[R][C] = {};
  int64_t i = 0;
  for (; i + kLanes <= k; i += kLanes) {
    V8 xv[R], wv[C];
    for (int r = 0; r < R; ++r) xv[r] = load8(x + r * ldx + i);
    for (int c = 0; c < C; ++c) wv[c] = load8(w + c * ldw + i);
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) acc[r][c] += xv[r] * wv[c];
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      float tail = 0;
      for (int64_t t = i; t < k; ++t) tail += x[r * ldx + t] * w[c * ldw + t];
      out[r * ldo + c] = reduce8(acc[r][c]) + tail + (bias ? bias[c] : 0.0f);
    }
}

// Rows [0, m) against W rows [n0, n1): full tiles, then the leftover rows and columns with
// narrower tiles (same per-element arithmetic). Cloned for AVX2; the default clone runs anywhere.
STRATA_CPU_CLONES void gemm_block(int64_t m, int64_t n0, int64_t n1, int64_t k, const float* px,
                                  int64_t ldx, const float* pw, int64_t ldw, float* po, int64_t ldo,
                                  const float* bias) {
  const float* b = nullptr;
  int64_t r = 0;
  for (; r + kRows <= m; r += kRows) {
    int64_t j = n0;
    for (; j + kCols <= n1; j += kCols) {
      b = bias ? bias + j : nullptr;
      tile<kRows, kCols>(px + r * ldx, ldx, pw + j * ldw, ldw, k, po + r * ldo + j, ldo, b);
    }
    for (; j < n1; ++j) {
      b = bias ? bias + j : nullptr;
      tile<kRows, 1>(px + r * ldx, ldx, pw + j * ldw, ldw, k, po + r * ldo + j, ldo, b);
    }
  }
  for (; r < m; ++r) {
    int64_t j = n0;
    for (; j + 4 <= n1; j += 4) {
      b = bias ? bias + j : nullptr;
      tile<1, 4>(px + r * ldx, ldx, pw + j * ldw, ldw, k, po + r * ldo + j, ldo, b);
    }
    for (; j < n1; ++j) {
      b = bias ? bias + j : nullptr;
      tile<1, 1>(px + r * ldx, ldx, pw + j * ldw, ldw, k, po + r * ldo + j, ldo, b);
    }
  }
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
      gemm_block(m, n0, n1, k, px, ldx, pw, ldw, po, ldo, bias);
    }
  });
}

void CpuBackend::linear(const Tensor& x, const LinearWeight& w, const Tensor& out) {
  // upload_linear dequantized every format to float32 (Backend's default).
  CHECK_MSG(w.is_dense() && w.stack == 1, "linear: expected one dense float32 matrix, got {} × {}",
            w.stack, w.format.str());
  const Tensor& wt = w.weight->view();
  const int64_t m = x.numel() / x.dim(-1), k = x.dim(-1), n = wt.dim(0);
  CHECK_MSG(wt.dim(1) == k, "linear: x has {} features, weight {}", k, shape_str(wt.shape));
  CHECK_EQ(out.numel(), m * n);
  gemm_nt(m, n, k, x.ptr<float>(), k, wt.ptr<float>(), k, out.ptr<float>(), n,
          w.bias ? w.bias->view().ptr<float>() : nullptr);
}

}  // namespace strata::cpu
