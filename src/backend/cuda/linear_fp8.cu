// FP8-block linears: the kernels (decode GEMV, activation quantization, dequantization, scale
// repacking). The cuBLASLt GEMM and the prefill linear that strings them together live in
// linear_fp8_gemm.cc.
//
// Design note.
// - Decode (m <= 16): W8A16. DeepSeek-V3's decode is weight-streaming bound, so the GEMV reads
//   every weight byte once with 16-byte loads (16 e4m3 values), converts them in registers with
//   the hardware e4m3x2 -> f16x2 conversion (exact), multiplies with the bf16 activations in
//   float32 and applies the 128x128 block's scale once per 16-element partial sum (a lane's 16
//   elements never straddle a 128-wide block: k offsets are multiples of 16). Layout as the bf16
//   GEMV (linear.cu): one warp per weight row, or KS warps per row on interleaved 512-element
//   chunks (short or few rows keep enough loads in flight), 4 loads in flight per lane, partial
//   sums meet in shared memory; SwiGLU fused the same way (gate and up rows in the two halves of
//   a block). Numerics: the weights are not rounded to bf16 after scaling (the CPU twin rounds
//   them): an NMSE of ~1e-6 against it, the order of bf16 output rounding.
//   Cost: ~24 conversion instructions per 16 weights plus ~35 per weight chunk per token row, so
//   the kernel is memory bound at m = 1-2 and CUDA-core bound beyond (m = 4 is ~1.5x the
//   streaming time at 4.8 TB/s): past the measured crossover (bench/cuda/fp8_linear_bench.cc)
//   the prefill path's tensor cores win.
// - Prefill: W8A8 on the FP8 tensor cores, as DeepSeek's own inference does: activations are
//   quantized per token per 128-wide k group (act_quant: scale = amax / 448), then one cuBLASLt
//   matmul with per-operand scale modes BLK128x128_32F (weights, the checkpoint's scale table
//   as is when ceil(k/128) % 4 == 0, else repacked once at load) and VEC128_32F (activations,
//   written by the quant kernel in the token-contiguous layout cuBLASLt wants). cuBLASLt needs
//   m % 4 == 0 for these modes: the last m % 4 rows go through the GEMV instead of padding the
//   output. Expected NMSE against the exact product: ~6e-4 (e4m3's 3 mantissa bits on the
//   activations), see tests/parity/linear_fp8_parity_test.cc.
// - MoE (issue 23): experts stacked in one allocation are addressed by base + index · stride
//   (Fp8Weight); the GEMV is already batched over (expert, rows) pairs.
#include <cuda_fp8.h>

#include <algorithm>

#include "backend/cuda/common.cuh"
#include "backend/cuda/fp8.cuh"
#include "backend/cuda/linear_fp8.h"

namespace strata::cuda {
namespace {

constexpr int kWarps = 8;        // warps per GEMV block
constexpr int kChunk = 512;      // k elements a warp covers with one 16-byte load per lane
constexpr int kUnroll = 4;       // 16-byte weight loads in flight per lane (m <= 8; 1 above)
constexpr int kWarpsPerSm = 64;  // k split: enough warps for ~2 waves of 32 per SM

// Sixteen e4m3 values (a 16-byte vector, lowest byte first) to floats, exactly.
__device__ __forceinline__ void e4m3x16_to_float(const uint4& v, float* f) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 a = e4m3x2_to_float2(uint16_t(w[i] & 0xffffu));
    const float2 b = e4m3x2_to_float2(uint16_t(w[i] >> 16));
    f[4 * i] = a.x;
    f[4 * i + 1] = a.y;
    f[4 * i + 2] = b.x;
    f[4 * i + 3] = b.y;
  }
}

// One 16-weight piece of a row against the M token rows of x (x points at this piece's k offset
// of token 0; rows are k apart).
template <int M>
__device__ __forceinline__ void gemv_piece(const uint4& wv, float scale, const bf16_bits* x,
                                           int64_t k, float* acc) {
  float wf[16];
  e4m3x16_to_float(wv, wf);
#pragma unroll
  for (int r = 0; r < M; ++r) {
    const bf16_bits* xr = x + int64_t(r) * k;
    float xf[8];
    unpack8(__ldg(reinterpret_cast<const uint4*>(xr)), xf);
    float d = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) d = fmaf(wf[i], xf[i], d);
    unpack8(__ldg(reinterpret_cast<const uint4*>(xr + 8)), xf);
#pragma unroll
    for (int i = 0; i < 8; ++i) d = fmaf(wf[8 + i], xf[i], d);
    acc[r] = fmaf(d, scale, acc[r]);
  }
}

// Block: kWarps warps = kWarps / KS row slots of KS warps each (KS = p.ksplit). Plain: slot s of
// block b streams row b · slots + s. GLU: the first half of the slots stream gate rows
// b · half + s, the second half the matching up rows; the gate slot's first warp writes
// silu(g) · u. grid.y: batches (MoE experts).
// Blocks per SM asked of ptxas: m = 1 fits 64 registers (32 warps per SM of loads in flight),
// m = 2 72, m >= 3 up to 128 (no spills, ptxas -v, CUDA 13.0: m > 8 only with one load in flight
// per lane, kU below; unbounded, m = 16 takes 179 registers and one block per SM).
constexpr int gemv_min_blocks(int m) { return m == 1 ? 4 : m == 2 ? 3 : 2; }

template <int M>
__global__ void __launch_bounds__(kWarps * 32, gemv_min_blocks(M))
    fp8_gemv_kernel(Fp8GemvParams p) {
  __shared__ float red[kWarps][M];
  pdl_enter(p.pdl_early);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int ks = p.ksplit;
  const int part = warp % ks, slot = warp / ks, slots = kWarps / ks;
  const bool glu = p.glu_inter > 0;
  const int half = slots / 2;
  int64_t row, col;
  bool valid;
  if (glu) {
    col = int64_t(blockIdx.x) * half + slot % half;
    valid = col < p.glu_inter;
    row = col + (slot < half ? 0 : p.glu_inter);
  } else {
    col = row = int64_t(blockIdx.x) * slots + slot;
    valid = row < p.w.n;
  }
  const int b = blockIdx.y;
  const int64_t expert = p.batch_ids ? p.batch_ids[b] : b;
  const int64_t k = p.w.k;
  const uint8_t* wrow = p.w.w + expert * p.w.w_stride + row * k;
  // GLU: the up rows' scales follow the gate's table (ceil(inter / 128) rows of it).
  const int64_t sblock = glu && row >= p.glu_inter ? (p.glu_inter + kFp8Block - 1) / kFp8Block +
                                                         (row - p.glu_inter) / kFp8Block
                                                   : row / kFp8Block;
  const float* srow = p.w.scale + expert * p.w.scale_stride + sblock * p.w.scale_ld;
  const bf16_bits* x = p.x + b * p.x_batch_stride;
  float acc[M];
#pragma unroll
  for (int r = 0; r < M; ++r) acc[r] = 0.0f;
  constexpr int kU = M <= 8 ? kUnroll : 1;  // m > 8: CUDA-core bound; registers to accumulators
  if (valid) {
    const int64_t step = int64_t(ks) * kChunk;
    // kU loads in flight per lane, the row's tail included (lanes past k idle).
    for (int64_t kk = int64_t(part) * kChunk + lane * 16; kk < k; kk += kU * step) {
      uint4 wv[kU];
      float sv[kU];
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int64_t c = kk + u * step;
        const bool in = c < k;
        wv[u] = in ? __ldcs(reinterpret_cast<const uint4*>(wrow + c)) : make_uint4(0, 0, 0, 0);
        sv[u] = in ? __ldg(srow + c / kFp8Block) : 0.0f;
      }
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int64_t c = kk + u * step;
        if (c < k) gemv_piece<M>(wv[u], sv[u], x + c, k, acc);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < M; ++r) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], o);
  }
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < M; ++r) red[warp][r] = acc[r];
  }
  __syncthreads();
  // Lane r of each slot's first warp finishes token r.
  const int r = lane;
  if (part != 0 || !valid || r >= M) return;
  float v = 0.0f;
  for (int j = 0; j < ks; ++j) v += red[slot * ks + j][r];
  bf16_bits* out = p.out + b * p.out_batch_stride;
  if (!glu) {
    out[r * p.w.n + row] = float_to_bf16(v + (p.bias ? p.bias[row] : 0.0f));
    return;
  }
  if (slot >= half) return;
  float u = 0.0f;
  for (int j = 0; j < ks; ++j) u += red[(slot + half) * ks + j][r];
  // The unfused path's roundings: a GEMV stores gate and up in bf16, silu_mul reads them.
  const float g = bf16_to_float(float_to_bf16(v + (p.bias ? p.bias[col] : 0.0f)));
  const float up = bf16_to_float(float_to_bf16(u + (p.bias ? p.bias[col + p.glu_inter] : 0.0f)));
  out[r * p.glu_inter + col] = float_to_bf16(g / (1.0f + __expf(-g)) * up);
}

template <int M>
void launch_gemv_m(const Fp8GemvParams& p, cudaStream_t stream) {
  const int slots = kWarps / p.ksplit;
  const int64_t units = p.glu_inter > 0 ? p.glu_inter : p.w.n;
  const int64_t per_block = p.glu_inter > 0 ? slots / 2 : slots;
  const dim3 grid(unsigned(ceil_div(units, per_block)), unsigned(p.batches));
  launch_pdl(fp8_gemv_kernel<M>, grid, dim3(kWarps * 32), 0, Launch{stream}, p);
  CUDA_LAUNCH_CHECK();
}

// Activation quantization: one warp per (token row, 512-wide chunk); lane l holds 16 values,
// 8 lanes make one 128-wide group. Block: 8 rows of the same chunk (their scales are adjacent).
__global__ void __launch_bounds__(256) fp8_act_quant_kernel(Fp8ActQuantParams p) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row = int64_t(blockIdx.x) * 8 + warp;
  const int64_t c = int64_t(blockIdx.y) * kChunk + lane * 16;
  if (row >= p.m) return;  // whole warps
  const bool in = c < p.k;
  float f[16];
  if (in) {
    const bf16_bits* xr = p.x + row * p.k + c;
    unpack8(__ldg(reinterpret_cast<const uint4*>(xr)), f);
    unpack8(__ldg(reinterpret_cast<const uint4*>(xr + 8)), f + 8);
  } else {
#pragma unroll
    for (int i = 0; i < 16; ++i) f[i] = 0.0f;
  }
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 16; ++i) amax = fmaxf(amax, fabsf(f[i]));
#pragma unroll
  for (int o = 4; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  if (!in) return;
  const float s = amax > 0.0f ? __fdiv_rn(amax, 448.0f) : 1.0f;
  uint32_t q[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __nv_fp8x2_storage_t lo = __nv_cvt_float2_to_fp8x2(
        make_float2(__fdiv_rn(f[4 * i], s), __fdiv_rn(f[4 * i + 1], s)), __NV_SATFINITE, __NV_E4M3);
    const __nv_fp8x2_storage_t hi = __nv_cvt_float2_to_fp8x2(
        make_float2(__fdiv_rn(f[4 * i + 2], s), __fdiv_rn(f[4 * i + 3], s)), __NV_SATFINITE,
        __NV_E4M3);
    q[i] = uint32_t(lo) | (uint32_t(hi) << 16);
  }
  *reinterpret_cast<uint4*>(p.q + row * p.k + c) = make_uint4(q[0], q[1], q[2], q[3]);
  if ((lane & 7) == 0) p.scale[(c / kFp8Block) * p.scale_ld + row] = s;
}

// Dequantization: one thread per 16 weights (row-major order, so loads and stores coalesce).
__global__ void __launch_bounds__(256) fp8_dequant_kernel(Fp8DequantParams p) {
  const int64_t per_row = p.w.k / 16;
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= p.w.n * per_row) return;
  const int64_t row = t / per_row, c = (t % per_row) * 16;
  const uint4 wv = __ldcs(reinterpret_cast<const uint4*>(p.w.w + row * p.w.k + c));
  const float s = p.w.scale[(row / kFp8Block) * p.w.scale_ld + c / kFp8Block];
  float f[16];
  e4m3x16_to_float(wv, f);
#pragma unroll
  for (int i = 0; i < 16; ++i) f[i] = __fmul_rn(f[i], s);
  uint4* out = reinterpret_cast<uint4*>(p.out + row * p.w.k + c);
  out[0] = pack8(f);
  out[1] = pack8(f + 8);
}

__global__ void fp8_repack_scales_kernel(Fp8RepackScalesParams p) {
  const int64_t total = p.rows * p.dst_ld;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / p.dst_ld, c = i % p.dst_ld;
    p.dst[i] = c < p.cols ? p.src[r * p.src_ld + c] : 0.0f;
  }
}

void check_weight(const Fp8Weight& w, const char* what) {
  CHECK_MSG(w.w && w.scale && w.n > 0 && w.k > 0, "{}: empty weight (n {} k {})", what, w.n, w.k);
  CHECK_MSG(w.k % 16 == 0 && uintptr_t(w.w) % 16 == 0 && w.w_stride % 16 == 0,
            "{}: weight rows must be 16-byte aligned (n {} k {} stride {})", what, w.n, w.k,
            w.w_stride);
  CHECK_MSG(w.scale_ld >= fp8_scale_cols(w.k), "{}: scale_ld {} < ceil({} / 128)", what, w.scale_ld,
            w.k);
}

}  // namespace

int fp8_gemv_auto_ksplit(int64_t rows, int64_t k, bool glu) {
  const int64_t chunks = ceil_div(k, kChunk);
  const int max_ks = glu ? 4 : 8;
  int ks = 1;
  while (ks < max_ks && 2 * ks <= chunks && rows * ks < int64_t(num_sms()) * kWarpsPerSm) ks *= 2;
  return ks;
}

void launch_fp8_gemv(const Fp8GemvParams& p_in, cudaStream_t stream) {
  if (p_in.m == 0 || p_in.batches == 0) return;
  check_weight(p_in.w, "fp8_gemv");
  CHECK_MSG(p_in.m >= 1 && p_in.m <= kFp8GemvMaxRows, "fp8_gemv: {} rows (max {})", p_in.m,
            kFp8GemvMaxRows);
  CHECK_MSG(uintptr_t(p_in.x) % 16 == 0 && p_in.x_batch_stride % 8 == 0,
            "fp8_gemv: x must be 16-byte aligned");
  CHECK_MSG(p_in.glu_inter == 0 || p_in.w.n == 2 * p_in.glu_inter,
            "fp8_gemv: GLU weight has {} rows for inter {}", p_in.w.n, p_in.glu_inter);
  CHECK(p_in.batches >= 1 && p_in.batches <= 65535);
  Fp8GemvParams p = p_in;
  const bool glu = p.glu_inter > 0;
  if (p.ksplit == 0) p.ksplit = fp8_gemv_auto_ksplit(p.w.n * p.batches, p.w.k, glu);
  CHECK_MSG(p.ksplit == 1 || p.ksplit == 2 || p.ksplit == 4 || (p.ksplit == 8 && !glu),
            "fp8_gemv: ksplit {} (glu {})", p.ksplit, int(glu));
  using Launcher = void (*)(const Fp8GemvParams&, cudaStream_t);
  static constexpr Launcher kByRows[kFp8GemvMaxRows] = {
      launch_gemv_m<1>,  launch_gemv_m<2>,  launch_gemv_m<3>,  launch_gemv_m<4>,
      launch_gemv_m<5>,  launch_gemv_m<6>,  launch_gemv_m<7>,  launch_gemv_m<8>,
      launch_gemv_m<9>,  launch_gemv_m<10>, launch_gemv_m<11>, launch_gemv_m<12>,
      launch_gemv_m<13>, launch_gemv_m<14>, launch_gemv_m<15>, launch_gemv_m<16>};
  kByRows[p.m - 1](p, stream);
}

void launch_fp8_act_quant(const Fp8ActQuantParams& p, cudaStream_t stream) {
  if (p.m == 0) return;
  CHECK_MSG(p.k > 0 && p.k % 16 == 0 && uintptr_t(p.x) % 16 == 0 && uintptr_t(p.q) % 16 == 0,
            "fp8_act_quant: k {} must be a multiple of 16, x and q 16-byte aligned", p.k);
  CHECK_MSG(p.scale_ld >= p.m, "fp8_act_quant: scale_ld {} < m {}", p.scale_ld, p.m);
  const dim3 grid(unsigned(ceil_div(p.m, 8)), unsigned(ceil_div(p.k, kChunk)));
  CHECK(grid.y <= 65535);
  fp8_act_quant_kernel<<<grid, 256, 0, stream>>>(p);
  CUDA_LAUNCH_CHECK();
}

void launch_fp8_dequant(const Fp8DequantParams& p, cudaStream_t stream) {
  check_weight(p.w, "fp8_dequant");
  CHECK(uintptr_t(p.out) % 16 == 0);
  const int64_t threads = p.w.n * (p.w.k / 16);
  fp8_dequant_kernel<<<unsigned(ceil_div(threads, 256)), 256, 0, stream>>>(p);
  CUDA_LAUNCH_CHECK();
}

void launch_fp8_repack_scales(const Fp8RepackScalesParams& p, cudaStream_t stream) {
  CHECK(p.cols <= p.src_ld && p.cols <= p.dst_ld && p.src != p.dst);
  const int64_t total = p.rows * p.dst_ld;
  if (total == 0) return;
  const unsigned blocks = unsigned(std::min<int64_t>(ceil_div(total, 256), 4096));
  fp8_repack_scales_kernel<<<blocks, 256, 0, stream>>>(p);
  CUDA_LAUNCH_CHECK();
}

}  // namespace strata::cuda
