// RMSNorm and fused residual-add + RMSNorm: one block per row, float32 sum of squares, the
// row kept in registers between the two passes (dim <= kThreads · kMaxPerThread).
#include "backend/cuda/common.cuh"

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
  pdl_wait();
  pdl_trigger();
  __shared__ float shared[kThreads / 32];
  const int64_t row = blockIdx.x;
  const bf16_bits* x = p.x + row * p.dim;
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
  bf16_bits* out = p.out + row * p.dim;
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
  pdl_wait();
  pdl_trigger();
  const int64_t row = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= p.rows) return;
  const bf16_bits* x = p.x + row * p.dim;
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
  bf16_bits* out = p.out + row * p.dim;
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

}  // namespace

void launch_rms_norm(const RmsNormParams& p, cudaStream_t stream) {
  if (p.rows == 0) return;
  CHECK_MSG(p.dim <= kThreads * kMaxPerThread, "rms_norm: dim {} too large", p.dim);
  if (p.dim <= 256) {
    launch_pdl(rms_norm_warp_kernel, dim3(unsigned(ceil_div(p.rows, 8))), dim3(256), 0, stream, p);
  } else {
    launch_pdl(rms_norm_kernel, dim3(unsigned(p.rows)), dim3(kThreads), 0, stream, p);
  }
  CUDA_LAUNCH_CHECK();
}

}  // namespace strata::cuda
