// Device-side helpers of the MoE kernel parity tests (moe_route_parity_test.cc,
// moe_experts_parity_test.cc, moe_gemm_shapes_parity_test.cc, moe_fp8_f16_parity_test.cc):
// device buffers and a stream (device_buffer.h), bf16 test data, the NMSE against a float64
// reference, a weight stack (moe_stack.h) uploaded in the kernels' layout beside the CPU twin's
// float32 copy of it, and the CPU twin's layer on host data.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/linear_int4.h"
#include "backend/cuda/moe_experts.h"
#include "core/dtype.h"
#include "core/weight_format.h"
#include "parity/moe_stack.h"
#include "support/device_buffer.h"

namespace strata::parity {

using cuda::bf16_bits;
using testing::Dev;
using testing::download;
using testing::kGuard;
using testing::read_output;
using testing::Stream;
using testing::upload;

inline std::unique_ptr<Dev> upload_bytes(const std::vector<uint8_t>& v, const Stream& s) {
  return upload(v, s);
}
inline std::unique_ptr<Dev> upload_bytes(const HostBytes& v,
                                         const Stream& s) {  // a HostLinearWeight's
  return upload(std::vector<uint8_t>(v.begin(), v.end()), s);
}

inline std::vector<float> random_bf16(std::mt19937& rng, int64_t count, float scale) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(count));
  for (float& x : v) x = round_to_bf16(d(rng));
  return v;
}
inline std::vector<uint16_t> to_bits(const std::vector<float>& v) {
  std::vector<uint16_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = f32_to_bf16(v[i]);
  return b;
}
inline std::vector<float> from_bits(const std::vector<uint16_t>& b) {
  std::vector<float> v(b.size());
  for (size_t i = 0; i < b.size(); ++i) v[i] = bf16_to_f32(b[i]);
  return v;
}

inline double nmse(const std::vector<float>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double g = got[i];
    if (!std::isfinite(g)) return INFINITY;
    num += (g - want[i]) * (g - want[i]);
    den += want[i] * want[i];
  }
  return den > 0 ? num / den : num;
}

// The stack on the device in the kernels' layout.
struct DevStack {
  std::unique_ptr<Dev> values, scales;
  cuda::MoeWeights view{};
};
inline DevStack to_device(const HostLinearWeight& w, Fmt f, const Stream& s) {
  DevStack d;
  const int64_t rows = w.stack * w.out;
  cuda::MoeWeights& v = d.view;
  v.n = w.out;
  v.k = w.in;
  if (f == Fmt::kInt4g32 || f == Fmt::kInt4g128) {
    v.format = cuda::kMoeInt4;
    v.group = w.format.group_size;
    v.values_stride = cuda::int4_packed_bytes(w.out, w.in);
    v.scales_stride = cuda::int4_scale_bytes(w.out, w.in, v.group);
    auto src_p = upload_bytes(w.values, s), src_s = upload_bytes(w.scales, s);
    d.values = std::make_unique<Dev>(size_t(cuda::int4_packed_bytes(rows, w.in)));
    d.scales = std::make_unique<Dev>(size_t(cuda::int4_scale_bytes(rows, w.in, v.group)));
    cuda::Int4RepackParams p{};
    p.src_packed = src_p->as<int32_t>();
    p.src_scale = src_s->as<bf16_bits>();
    p.dst_packed = d.values->as<void>();
    p.dst_scale = d.scales->as<bf16_bits>();
    p.n = rows;
    p.k = w.in;
    p.src_cols = w.in / 8;
    p.group = v.group;
    cuda::launch_int4_repack(p, s.get());
    s.sync();
  } else {
    v.format = f == Fmt::kBf16 ? cuda::kMoeBf16 : cuda::kMoeFp8;
    v.values_stride = cuda::moe_values_bytes(v.format, w.out, w.in);
    auto src = upload_bytes(w.values, s);
    d.values = std::make_unique<Dev>(size_t(v.values_stride * w.stack));
    cuda::MoeRepackParams p{};
    p.src = src->as<void>();
    p.dst = d.values->as<void>();
    p.rows = rows;
    p.k = w.in;
    p.format = v.format;
    cuda::launch_moe_repack(p, s.get());
    s.sync();
    if (f == Fmt::kFp8) {
      d.scales = upload_bytes(w.scales, s);
      v.scales_stride = cuda::moe_scale_bytes(v.format, w.out, w.in, 0);
    }
  }
  v.values = d.values->as<void>();
  v.scales = d.scales ? d.scales->as<void>() : nullptr;
  return d;
}

// The CPU twin's MoE layer (cpu::CpuBackend::moe_experts) on host data: x [tokens, hidden],
// each token's top_k expert ids and weights (ids and wts [tokens, top_k]); its float32 output as
// float64 [tokens, hidden] (the parity tests' reference).
inline std::vector<double> cpu_moe_experts(cpu::CpuBackend& cpu, const MoeExpertWeights& w,
                                           const std::vector<float>& x,
                                           const std::vector<int32_t>& ids,
                                           const std::vector<float>& wts, int top_k) {
  const int64_t tokens = int64_t(ids.size()) / top_k, hidden = int64_t(x.size()) / tokens;
  HostTensor hx(DType::kF32, {tokens, hidden}), hids(DType::kI32, {tokens, top_k}),
      hw(DType::kF32, {tokens, top_k}), ho(DType::kF32, {tokens, hidden});
  std::memcpy(hx.f32(), x.data(), x.size() * 4);
  std::memcpy(hids.view.ptr<int32_t>(), ids.data(), ids.size() * 4);
  std::memcpy(hw.f32(), wts.data(), wts.size() * 4);
  cpu.moe_experts(hx.view, w, hids.view, hw.view, ho.view);
  return std::vector<double>(ho.f32(), ho.f32() + tokens * hidden);
}

// The CPU twin's weight tensor: float32 [stack, out, in].
inline DeviceTensorPtr cpu_weight(cpu::CpuBackend& cpu, const HostLinearWeight& w) {
  auto t = cpu.alloc(DType::kF32, {w.stack, w.out, w.in});
  dequantize_linear(w, t->view().ptr<float>());
  return t;
}

}  // namespace strata::parity
