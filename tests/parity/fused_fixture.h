// The fused-op parity tests' fixture (fused_ops_parity_test.cc, and the development GEMV's
// tests in bench/cuda/dev/dev_parity_test.cc): the same random bf16 values on the CPU reference
// and the CUDA backend, linear_silu_mul cases with the CPU's output, and the comparisons.
#pragma once

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "support/golden.h"

namespace strata::parity {

struct Fixture {
  std::unique_ptr<Backend> cpu = make_cpu_backend(), gpu = make_cuda_backend();
  cuda::CudaBackend& cg = dynamic_cast<cuda::CudaBackend&>(*gpu);
  std::mt19937 rng{4321};

  std::vector<float> random(int64_t n, float scale = 1.0f) {
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = round_to_bf16(d(rng));
    return v;
  }
  DeviceTensorPtr up(Backend& b, const std::vector<float>& v, const Shape& shape, DType dt) {
    Tensor h = Tensor::make(const_cast<float*>(v.data()), DType::kF32, shape);
    return b.upload(h, dt);
  }
  std::vector<float> get(Backend& b, const Tensor& t) {
    std::vector<float> v(size_t(t.numel()));
    b.download_f32(t, v.data());
    return v;
  }

  // linear_silu_mul's inputs (x [m, k], gate-up weight [2 · inter, k], optional bias) on the GPU
  // and the CPU reference's output.
  struct GluCase {
    int m = 0, inter = 0;
    LinearWeight w;
    DeviceTensorPtr x;
    std::vector<float> want;
  };
  GluCase glu_case(int m, int k, int inter, bool bias) {
    const int64_t n = 2 * int64_t(inter);
    auto xv = random(int64_t(m) * k);
    auto wv = random(n * k, 0.05f);
    auto bv = random(n);
    LinearWeight wc;
    GluCase g;
    g.m = m;
    g.inter = inter;
    wc.weight = up(*cpu, wv, {n, k}, DType::kF32);
    g.w.weight = up(*gpu, wv, {n, k}, DType::kBF16);
    if (bias) {
      wc.bias = up(*cpu, bv, {n}, DType::kF32);
      g.w.bias = up(*gpu, bv, {n}, DType::kF32);
    }
    auto xc = up(*cpu, xv, {m, k}, DType::kF32);
    g.x = up(*gpu, xv, {m, k}, DType::kBF16);
    auto oc = up(*cpu, nans(m, inter), {m, inter}, DType::kF32);
    cpu->linear_silu_mul(*xc, wc, *oc);
    g.want = get(*cpu, *oc);
    return g;
  }
  // The GPU's linear_silu_mul of `g` under the current settings (its output starts as NaN).
  std::vector<float> gpu_glu(const GluCase& g) {
    auto out = up(*gpu, nans(g.m, g.inter), {g.m, g.inter}, DType::kBF16);
    gpu->linear_silu_mul(*g.x, g.w, *out);
    return get(*gpu, *out);
  }
  static std::vector<float> nans(int rows, int cols) {
    return std::vector<float>(size_t(rows) * size_t(cols), NAN);
  }
};

using testing::nmse;  // support/golden.h

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace strata::parity
