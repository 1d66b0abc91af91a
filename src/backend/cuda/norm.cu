// RMSNorm and fused residual-add + RMSNorm: one block per row, float32 sum of squares, the
// row kept in registers between the two passes (16-byte rows: dim <= 32,768; others:
// dim <= kThreads · kMaxPerThread).
#include <algorithm>

#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/norm.h"
#include "backend/cuda/norm_weight.cuh"

namespace strata::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxPerThread = 32;  // dims up to 8192

__device__ float block_sum(float v, float* shared) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  float total = 0;
  for (int w = 0; w < int(blockDim.x / 32); ++w) total += shared[w];
  return total;
}

__global__ void __launch_bounds__(kThreads) rms_norm_kernel(RmsNormParams p) {
  pdl_enter(p.pdl_early);
  __shared__ float shared[kThreads / 32];
  const int64_t row = blockIdx.x;
  const int64_t stride = p.row_stride ? p.row_stride : p.dim;
  const bf16_bits* x = p.x + row * stride;
  bf16_bits* res = p.residual ? p.residual + row * p.dim : nullptr;
  float vals[kMaxPerThread];
  float ss = 0;
#pragma unroll
  for (int j = 0; j < kMaxPerThread; ++j) {
    const int i = threadIdx.x + j * kThreads;
    if (i < p.dim) {
      float v = bf16_to_float(x[i]);
      if (res) {
        // The residual stream is stored in bf16 (as Hugging Face's bf16 models keep it); the
        // norm reads the rounded sum so the two stay consistent.
        v = bf16_to_float(float_to_bf16(v + bf16_to_float(res[i])));
        res[i] = float_to_bf16(v);
      }
      vals[j] = v;
      ss += v * v;
    }
  }
  ss = block_sum(ss, shared);
  const float inv = rsqrtf(ss / float(p.dim) + p.eps);
  bf16_bits* out = p.out + row * stride;
#pragma unroll
  for (int j = 0; j < kMaxPerThread; ++j) {
    const int i = threadIdx.x + j * kThreads;
    if (i < p.dim) {
      const float w = p.weight_f32 ? static_cast<const float*>(p.weight)[i]
                                   : bf16_to_float(static_cast<const bf16_bits*>(p.weight)[i]);
      out[i] = float_to_bf16(w * (vals[j] * inv));
    }
  }
}

// Small rows (head-dim q/k norms): one warp per row.
__global__ void rms_norm_warp_kernel(RmsNormParams p) {
  pdl_enter(p.pdl_early);
  const int64_t row = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= p.rows) return;
  const int64_t stride = p.row_stride ? p.row_stride : p.dim;
  const bf16_bits* x = p.x + row * stride;
  bf16_bits* res = p.residual ? p.residual + row * p.dim : nullptr;
  float vals[8];
  float ss = 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int i = lane + j * 32;
    if (i < p.dim) {
      float v = bf16_to_float(x[i]);
      if (res) {
        v = bf16_to_float(float_to_bf16(v + bf16_to_float(res[i])));
        res[i] = float_to_bf16(v);
      }
      vals[j] = v;
      ss += v * v;
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  const float inv = rsqrtf(ss / float(p.dim) + p.eps);
  bf16_bits* out = p.out + row * stride;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int i = lane + j * 32;
    if (i < p.dim) {
      const float w = p.weight_f32 ? static_cast<const float*>(p.weight)[i]
                                   : bf16_to_float(static_cast<const bf16_bits*>(p.weight)[i]);
      out[i] = float_to_bf16(w * (vals[j] * inv));
    }
  }
}

// Rows whose dim is a multiple of 8 (every hidden size): 16-byte loads, one 8-value chunk per
// thread per pass (up to kChunks passes), values kept in registers between the two passes.
// p.weight_preload: bf16 weights loaded before the PDL wait, so the output pass does not wait on
// their load after the row's reduction (a batch-1 step's norms are one block each, on the
// critical path between two GEMVs).
template <int kChunks>
__global__ void __launch_bounds__(1024) rms_norm_vec_kernel(RmsNormParams p) {
  const int nchunk = p.dim / 8;
  const bool pre = p.weight_preload && !p.weight_f32;
  uint4 wraw[kChunks];
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int idx = threadIdx.x + c * blockDim.x;
    wraw[c] = pre && idx < nchunk ? __ldg(static_cast<const uint4*>(p.weight) + idx)
                                  : make_uint4(0, 0, 0, 0);
  }
  pdl_enter(p.pdl_early);
  __shared__ float shared[32];
  const int64_t row = blockIdx.x;
  const int64_t stride = p.row_stride ? p.row_stride : p.dim;
  const uint4* x = reinterpret_cast<const uint4*>(p.x + row * stride);
  uint4* res = p.residual ? reinterpret_cast<uint4*>(p.residual + row * p.dim) : nullptr;
  float v[kChunks][8];
  float ss = 0;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int idx = threadIdx.x + c * blockDim.x;
    if (idx < nchunk) {
      unpack8(x[idx], v[c]);
      if (res) {
        float r[8];
        unpack8(res[idx], r);
#pragma unroll
        for (int e = 0; e < 8; ++e) v[c][e] = bf16_to_float(float_to_bf16(v[c][e] + r[e]));
        res[idx] = pack8(v[c]);
      }
#pragma unroll
      for (int e = 0; e < 8; ++e) ss += v[c][e] * v[c][e];
    }
  }
  ss = block_sum(ss, shared);
  const float inv = rsqrtf(ss / float(p.dim) + p.eps);
  uint4* out = reinterpret_cast<uint4*>(p.out + row * stride);
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int idx = threadIdx.x + c * blockDim.x;
    if (idx < nchunk) {
      float w[8], o[8];
      if (pre)
        unpack8(wraw[c], w);
      else
        norm_weight8(p.weight, p.weight_f32, idx, w);
#pragma unroll
      for (int e = 0; e < 8; ++e) o[e] = w[e] * (v[c][e] * inv);
      out[idx] = pack8(o);
    }
  }
}

}  // namespace

RmsNormKernel rms_norm_kernel_for(const RmsNormParams& p) {
  const bool vec = p.dim % 8 == 0 && p.dim > 256 && p.dim / 8 <= 4 * 1024 &&
                   uintptr_t(p.x) % 16 == 0 && uintptr_t(p.out) % 16 == 0 &&
                   uintptr_t(p.weight) % 16 == 0 && uintptr_t(p.residual) % 16 == 0 &&
                   p.row_stride % 8 == 0;
  if (vec) return p.dim / 8 <= 1024 ? RmsNormKernel::kVecOnePass : RmsNormKernel::kVecMultiPass;
  return p.dim <= 256 ? RmsNormKernel::kWarp : RmsNormKernel::kBlock;
}

void launch_rms_norm(const RmsNormParams& p, const Launch& launch) {
  if (p.rows == 0) return;
  const RmsNormKernel kind = rms_norm_kernel_for(p);
  // The row kernel takes dims to 32,768 (Llama-3.1-405B's 16,384 among them); the block kernel,
  // for rows off its 16-byte grid, keeps a row in registers.
  CHECK_MSG(kind != RmsNormKernel::kBlock || p.dim <= kThreads * kMaxPerThread,
            "rms_norm: dim {} of rows not 16-byte aligned (or not a multiple of 8): at most {}",
            p.dim, kThreads * kMaxPerThread);
  if (kind == RmsNormKernel::kVecOnePass || kind == RmsNormKernel::kVecMultiPass) {
    const int nchunk = p.dim / 8;
    const int threads = int(std::min<int64_t>(1024, ceil_div(nchunk, 32) * 32));
    const int chunks = int(ceil_div(nchunk, threads));
    const dim3 grid{unsigned(p.rows)}, block{unsigned(threads)};
    if (chunks == 1)
      launch_pdl(rms_norm_vec_kernel<1>, grid, block, 0, launch, p);
    else if (chunks == 2)
      launch_pdl(rms_norm_vec_kernel<2>, grid, block, 0, launch, p);
    else
      launch_pdl(rms_norm_vec_kernel<4>, grid, block, 0, launch, p);
  } else if (kind == RmsNormKernel::kWarp) {
    launch_pdl(rms_norm_warp_kernel, dim3(unsigned(ceil_div(p.rows, 8))), dim3(256), 0, launch, p);
  } else {
    launch_pdl(rms_norm_kernel, dim3(unsigned(p.rows)), dim3(kThreads), 0, launch, p);
  }
  CUDA_LAUNCH_CHECK();
}

// ---- host entries ----
void CudaBackend::rms_norm(const Tensor& x, const Tensor& weight, float eps, const Tensor& out) {
  const int64_t d = weight.numel(), rows = x.numel() / d;
  CHECK_EQ(out.numel(), x.numel());
  check_bf16(x, "rms_norm x");
  check_bf16(out, "rms_norm out");
  begin_op();
  auto p = zeroed<RmsNormParams>();
  p.x = x.ptr<bf16_bits>();
  p.weight = weight.data;
  p.weight_f32 = weight.dtype == DType::kF32;
  p.out = out.ptr<bf16_bits>();
  p.rows = rows;
  p.dim = int(d);
  p.eps = eps;
  p.pdl_early = tunables_.pdl_early;
  p.weight_preload = tunables_.norm_weight_preload;
  record(kOpRmsNorm, p, launch_rms_norm);
}

void CudaBackend::rms_norm_columns(const Tensor& x, const Tensor& weight, float eps) {
  if (!tunables_.fusion) return Backend::rms_norm_columns(x, weight, eps);
  const int64_t d = weight.numel();
  CHECK_EQ(x.rank(), 2);
  CHECK_LE(d, x.dim(1));
  check_bf16(x, "rms_norm_columns x");
  begin_op();
  auto p = zeroed<RmsNormParams>();
  p.x = x.ptr<bf16_bits>();
  p.weight = weight.data;
  p.weight_f32 = weight.dtype == DType::kF32;
  p.out = x.ptr<bf16_bits>();
  p.rows = x.dim(0);
  p.row_stride = x.dim(1);
  p.dim = int(d);
  p.eps = eps;
  p.pdl_early = tunables_.pdl_early;
  p.weight_preload = tunables_.norm_weight_preload;
  record(kOpRmsNorm, p, launch_rms_norm);
}

void CudaBackend::add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& weight,
                               float eps, const Tensor& out) {
  const int64_t d = weight.numel(), rows = x.numel() / d;
  CHECK_EQ(residual.numel(), x.numel());
  CHECK_EQ(out.numel(), x.numel());
  check_bf16(x, "add_rms_norm x");
  check_bf16(residual, "add_rms_norm residual");
  check_bf16(out, "add_rms_norm out");
  begin_op();
  auto p = zeroed<RmsNormParams>();
  p.x = x.ptr<bf16_bits>();
  p.residual = residual.ptr<bf16_bits>();
  p.weight = weight.data;
  p.weight_f32 = weight.dtype == DType::kF32;
  p.out = out.ptr<bf16_bits>();
  p.rows = rows;
  p.dim = int(d);
  p.eps = eps;
  p.pdl_early = tunables_.pdl_early;
  p.weight_preload = tunables_.norm_weight_preload;
  if (merge_moe_combine_norm(p)) return;  // graph mode: inside the MoE combine just recorded
  if (merge_int4_add_norm(p)) return;     // graph mode: the update inside the W4A16 GEMV
  record(kOpRmsNorm, p, launch_rms_norm);
}

}  // namespace strata::cuda
