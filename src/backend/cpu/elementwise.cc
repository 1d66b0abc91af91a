// Row-wise and element-wise ops of the CPU reference backend.
#include <cmath>

#include "backend/cpu/cpu_backend.h"
#include "core/thread_pool.h"

namespace strata::cpu {

namespace {
void rms_norm_row(const float* x, const float* w, float eps, int64_t d, float* out) {
  double ss = 0;  // accumulate in double: the reference should not be the noisy side
  for (int64_t i = 0; i < d; ++i) ss += double(x[i]) * x[i];
  const float inv = float(1.0 / std::sqrt(ss / double(d) + eps));
  for (int64_t i = 0; i < d; ++i) out[i] = w[i] * (x[i] * inv);
}
}  // namespace

void CpuBackend::rms_norm(const Tensor& x, const Tensor& weight, float eps, const Tensor& out) {
  const int64_t d = weight.numel(), rows = x.numel() / d;
  CHECK_EQ(out.numel(), x.numel());
  const float *px = x.ptr<float>(), *pw = weight.ptr<float>();
  float* po = out.ptr<float>();
  parallel_for(rows, 64, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) rms_norm_row(px + r * d, pw, eps, d, po + r * d);
  });
}

void CpuBackend::add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& weight,
                              float eps, const Tensor& out) {
  const int64_t d = weight.numel(), rows = x.numel() / d;
  const float *px = x.ptr<float>(), *pw = weight.ptr<float>();
  float *pr = residual.ptr<float>(), *po = out.ptr<float>();
  parallel_for(rows, 64, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      for (int64_t i = 0; i < d; ++i) pr[r * d + i] += px[r * d + i];
      rms_norm_row(pr + r * d, pw, eps, d, po + r * d);
    }
  });
}

void CpuBackend::add(const Tensor& a, const Tensor& b, const Tensor& out) {
  CHECK_EQ(a.numel(), b.numel());
  const float *pa = a.ptr<float>(), *pb = b.ptr<float>();
  float* po = out.ptr<float>();
  for (int64_t i = 0, n = a.numel(); i < n; ++i) po[i] = pa[i] + pb[i];
}

void CpuBackend::silu_mul(const Tensor& x, const Tensor& out) {
  const int64_t rows = x.dim(0), inter = out.dim(1);
  CHECK_EQ(x.dim(1), 2 * inter);
  const float* px = x.ptr<float>();
  float* po = out.ptr<float>();
  parallel_for(rows, 16, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const float *g = px + r * 2 * inter, *u = g + inter;
      for (int64_t i = 0; i < inter; ++i)
        po[r * inter + i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
    }
  });
}

void CpuBackend::rope(const Tensor& x, const int32_t* positions, const RopeArgs& args) {
  CHECK_EQ(x.rank(), 3);
  const int64_t tokens = x.dim(0), heads = x.dim(1), stride = x.dim(2);
  const int half = args.rotary_dim / 2;
  CHECK_LE(args.offset + args.rotary_dim, stride);
  float* px = x.ptr<float>();
  parallel_for(tokens, 8, [&](int64_t b, int64_t e) {
    std::vector<float> cs(static_cast<size_t>(half)), sn(static_cast<size_t>(half));
    for (int64_t t = b; t < e; ++t) {
      for (int i = 0; i < half; ++i) {
        // float32 angle, as Hugging Face computes it (position · inv_freq in float32).
        const float angle = float(positions[t]) * args.inv_freq[i];
        cs[size_t(i)] = std::cos(angle) * args.attention_factor;
        sn[size_t(i)] = std::sin(angle) * args.attention_factor;
      }
      for (int64_t h = 0; h < heads; ++h) {
        float* v = px + (t * heads + h) * stride + args.offset;
        for (int i = 0; i < half; ++i) {
          const int i0 = args.interleaved ? 2 * i : i;
          const int i1 = args.interleaved ? 2 * i + 1 : i + half;
          const float a = v[i0], c = v[i1];
          v[i0] = a * cs[size_t(i)] - c * sn[size_t(i)];
          v[i1] = c * cs[size_t(i)] + a * sn[size_t(i)];
        }
      }
    }
  });
}

}  // namespace strata::cpu
