// Linear layers and their host entries (linear.h): out [m, n] = x [m, k] · w [n, k]ᵀ (+ bias),
// bf16 in and out, float32 accumulation. Small m (decode) streams the weights through a GEMV
// kernel that reads each weight byte once with 16-byte loads (optionally with SwiGLU as its
// epilogue: gate-up projection and silu·mul in one launch); larger m goes to cuBLAS (bf16
// tensor cores) followed by the bias epilogue; per-head linears are one strided-batched GEMM.
#include <cublas_v2.h>

#include <algorithm>

#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/linear.h"
#include "backend/cuda/linear_det.h"
#include "backend/cuda/norm_prologue.cuh"
#include "backend/cuda/per_head_gemv.h"

namespace strata::cuda {
namespace {

constexpr int kMaxWarps = 8;  // warps per block: 8 (default) or 4 (GemvParams::block_warps)
constexpr int kUnroll = 4;    // independent 16-byte weight loads in flight per lane

// KS warps share each output row (interleaved 256-element blocks of k) so that small-n layers
// still put enough loads in flight on every SM; partial sums meet in shared memory.
// GLU: the block's first half of warps stream gate rows, the second half the matching up rows
// (KS = 1), and the first half writes silu(gate) · up.
// With prefetch_elems > 0, before waiting on its predecessor (PDL) every warp prefetches the
// leading weights of its row into L2 and its first batch into registers: weights are never
// written by a kernel, so the stream could start while the previous kernel still runs. Off by
// default: on the H200 it made every GEMV slower (back to back, 8B shapes: 3.93 -> 4.37 ms per
// token's GEMVs, lm_head alone 237 -> 255 us; in the decode step +0.2 ms/token), most likely
// because the prefetches double the requests the L2 serves for the same bytes. prefetch_elems
// -1: the first batch into registers only, no L2 prefetch (the W4A16 register GEMV's way: its
// ring before the wait). Off: mixed on H100s (2026-12-05: Moonlight and a Kimi-K2.5 rank at
// batch 1 -0.8 / -1.6%, Llama-3.1-8B bf16 +0.9% in one run; Kimi -1.1 to +0.4% in four more;
// variant gemv_preload_regs).
// The last steps of a row (fewer than kUnroll) load together: MLA's q_b at batch 1 (1,536
// weights a row, 6 loads a lane) was three dependent round trips, now two (a Kimi-K2.5 rank's
// q_b 4.58 -> 4.38 us after q_a, timeline, H200, 2026-12-04).
// NORM (M <= 2): x's rows normalized into shared memory first (norm_prologue.cuh).
template <int M, int KS, bool GLU, bool NORM = false>
__global__ void __launch_bounds__(kMaxWarps * 32) gemv_kernel(GemvParams p) {
  if (p.pdl_early) pdl_trigger();
  __shared__ float red[kMaxWarps][M];
  const int warps = int(blockDim.x / 32);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // A merged pair (GemvParams::w2): the second GEMV's blocks follow the first's.
  int64_t block = blockIdx.x, rows = p.n;
  const bf16_bits* w = p.w;
  const float* bias = p.bias;
  bf16_bits* out = p.out;
  if (!GLU && p.w2 != nullptr && block >= p.blocks1) {
    block -= p.blocks1;
    rows = p.n2;
    w = p.w2;
    bias = p.bias2;
    out = p.out2;
  }
  int64_t n, col;  // the weight row this warp streams; the output column it feeds
  bool valid;
  int part = 0;
  if constexpr (GLU) {
    const int half = warps / 2;
    col = block * half + warp % half;
    valid = col < p.glu_inter;
    n = col + (warp < half ? 0 : p.glu_inter);
  } else {
    col = n = block * (warps / KS) + warp / KS;
    part = warp % KS;
    valid = n < rows;
  }
  const bf16_bits* wrow = w + n * p.k;
  constexpr int kStep = KS * 256;
  const int64_t k0 = int64_t(part) * 256 + lane * 8;
  // With the prefetch on, the first batch of this lane's weights also goes to registers.
  const bool preloaded = valid && p.prefetch_elems != 0 && k0 + (kUnroll - 1) * kStep < p.k;
  uint4 wv[kUnroll];
  if (preloaded) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      wv[u] = __ldcs(reinterpret_cast<const uint4*>(wrow + k0 + u * kStep));
  }
  if (valid && part == 0 && p.prefetch_elems > 0) {
    const int64_t pf = p.prefetch_elems < p.k ? p.prefetch_elems : p.k;
    for (int64_t e = int64_t(lane) * 64; e < pf; e += 32 * 64) prefetch_l2(wrow + e);
  }
  // M = 1 only: at M = 2 the held chunks spilled 8 bytes (ptxas, 2026-12-07).
  NormHeld held{};
  if constexpr (NORM && M == 1) held = norm_prologue_preload(p.norm, p.k);
  pdl_wait();
  if (!p.pdl_early) pdl_trigger();
  const bf16_bits* xn = nullptr;  // NORM: the normalized rows (shared memory)
  if constexpr (NORM) {
    extern __shared__ __align__(16) char norm_smem[];
    xn = norm_prologue<M>(p.norm, p.k, const_cast<bf16_bits*>(p.x), norm_smem, held);
  }
  auto load_x = [&](int64_t off) {  // x's 8 values at element off
    if constexpr (NORM) return *reinterpret_cast<const uint4*>(xn + off);
    return __ldg(reinterpret_cast<const uint4*>(p.x + off));
  };
  float acc[M];
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = 0;
  // One step: 8 weights at element k (in wq) against each row of x. Every path below adds the
  // steps in k order, so the sums do not depend on how the loads were batched.
  auto step = [&](const uint4& wq, int64_t k) {
    float wf[8];
    unpack8(wq, wf);
#pragma unroll
    for (int m = 0; m < M; ++m) {
      float xf[8];
      unpack8(load_x(m * p.k + k), xf);
      acc[m] += dot8(wf, xf);
    }
  };
  if (valid) {
    int64_t k = k0;
    for (; k + (kUnroll - 1) * kStep < p.k; k += kUnroll * kStep) {
      if (k != k0 || !preloaded) {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
          wv[u] = __ldcs(reinterpret_cast<const uint4*>(wrow + k + u * kStep));
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) step(wv[u], k + u * kStep);
    }
    // The tail (fewer than kUnroll steps left): its loads issued together, one round trip.
#pragma unroll
    for (int u = 0; u < kUnroll - 1; ++u)
      if (k + u * kStep < p.k) wv[u] = __ldcs(reinterpret_cast<const uint4*>(wrow + k + u * kStep));
#pragma unroll
    for (int u = 0; u < kUnroll - 1; ++u)
      if (k + u * kStep < p.k) step(wv[u], k + u * kStep);
  }
#pragma unroll
  for (int m = 0; m < M; ++m) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc[m] += __shfl_xor_sync(0xffffffffu, acc[m], o);
  }
  if constexpr (GLU) {
    const int half = warps / 2;
    if (lane == 0 && warp >= half) {
#pragma unroll
      for (int m = 0; m < M; ++m) red[warp][m] = acc[m];
    }
    __syncthreads();
    if (lane == 0 && warp < half && valid) {
      const float bg = bias ? bias[col] : 0.0f;
      const float bu = bias ? bias[col + p.glu_inter] : 0.0f;
#pragma unroll
      for (int m = 0; m < M; ++m) {
        // The unfused path's roundings: the GEMV stores gate and up in bf16, silu_mul reads them.
        const float g = bf16_to_float(float_to_bf16(acc[m] + bg));
        const float u = bf16_to_float(float_to_bf16(red[warp + half][m] + bu));
        out[m * p.glu_inter + col] = float_to_bf16(g / (1.0f + __expf(-g)) * u);
      }
    }
    return;
  }
  if (KS > 1) {
    if (lane == 0) {
#pragma unroll
      for (int m = 0; m < M; ++m) red[warp][m] = acc[m];
    }
    __syncthreads();
    if (lane == 0 && part == 0) {
#pragma unroll
      for (int m = 0; m < M; ++m) {
        float s = 0;
#pragma unroll
        for (int j = 0; j < KS; ++j) s += red[warp + j][m];
        acc[m] = s;
      }
    }
  }
  if (lane == 0 && part == 0 && valid) {
    const float b = bias ? bias[n] : 0.0f;
#pragma unroll
    for (int m = 0; m < M; ++m) out[m * rows + n] = float_to_bf16(acc[m] + b);
  }
}

// The cuBLAS GEMM's bias epilogue: grid-stride, 256-thread blocks.
constexpr int kBiasThreads = 256;

__global__ void bias_add_kernel(BiasAddParams p) {
  pdl_wait();
  pdl_trigger();
  const int64_t n = p.rows * p.cols;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    p.out[i] = float_to_bf16(bf16_to_float(p.out[i]) + p.bias[i % p.cols]);
}

struct GemmParams {
  cublasHandle_t handle;
  const void* x;  // [m, k] (row stride ldx)
  const void* w;  // [n, k] (row stride ldw)
  void* out;      // [m, n] (row stride ldo)
  int m, n, k;
  int ldx, ldw, ldo;
  int batch;  // strided-batched when > 1
  int64_t stride_x, stride_w, stride_o;
};

// One GEMM as both GEMMs take it, cuBLAS's (GemmParams) and the batch-invariant one
// (DetGemmParams): out_b = x_b · w_bᵀ for b < batch, row-major, strides in elements.
struct GemmOperands {
  const void* x;
  const void* w;
  void* out;
  int64_t m, n, k;
  int64_t ldx, ldw, ldo;
  int64_t batch = 1;
  int64_t stride_x = 0, stride_w = 0, stride_o = 0;

  // Dense operands: x [m, k], w [n, k], out [m, n].
  static GemmOperands dense(const void* x, const void* w, void* out, int64_t m, int64_t n,
                            int64_t k) {
    return {x, w, out, m, n, k, k, k, n};
  }
  template <class Params>
  void fill(Params& p) const {
    p.x = static_cast<decltype(p.x)>(x);
    p.w = static_cast<decltype(p.w)>(w);
    p.out = out;
    p.m = int(m);
    p.n = int(n);
    p.k = int(k);
    p.ldx = int(ldx);
    p.ldw = int(ldw);
    p.ldo = int(ldo);
    p.batch = int(batch);
    p.stride_x = stride_x;
    p.stride_w = stride_w;
    p.stride_o = stride_o;
  }
};

void run_gemm(const GemmParams& p, const Launch& launch) {
  CHECK(cublasSetStream(p.handle, launch.stream) == CUBLAS_STATUS_SUCCESS);
  const float alpha = 1.0f, beta = 0.0f;
  // Row-major out = x · wᵀ is column-major outᵀ [n, m] = (w as k×n column-major)ᵀ · (x as k×m).
  cublasStatus_t st;
  if (p.batch <= 1) {
    st = cublasGemmEx(p.handle, CUBLAS_OP_T, CUBLAS_OP_N, p.n, p.m, p.k, &alpha, p.w, CUDA_R_16BF,
                      p.ldw, p.x, CUDA_R_16BF, p.ldx, &beta, p.out, CUDA_R_16BF, p.ldo,
                      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  } else {
    st = cublasGemmStridedBatchedEx(p.handle, CUBLAS_OP_T, CUBLAS_OP_N, p.n, p.m, p.k, &alpha, p.w,
                                    CUDA_R_16BF, p.ldw, p.stride_w, p.x, CUDA_R_16BF, p.ldx,
                                    p.stride_x, &beta, p.out, CUDA_R_16BF, p.ldo, p.stride_o,
                                    p.batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  }
  CHECK_MSG(st == CUBLAS_STATUS_SUCCESS, "cuBLAS GEMM failed: status {} (m {} n {} k {})", int(st),
            p.m, p.n, p.k);
}

template <int M>
void launch_gemv_m(const GemvParams& p, const Launch& launch) {
  const int warps = p.block_warps == 4 ? 4 : kMaxWarps;
  const dim3 block(unsigned(warps * 32));
  CHECK_MSG(p.norm.x == nullptr || M <= 2, "gemv norm: {} rows (at most 2)", M);
  if (p.glu_inter > 0) {
    const dim3 grid(unsigned(ceil_div(p.glu_inter, warps / 2)));
    if constexpr (M <= 2) {
      if (p.norm.x != nullptr) {
        launch_pdl(gemv_kernel<M, 1, true, true>, grid, block, norm_prologue_smem_bytes(M, p.k),
                   launch, p);
        CUDA_LAUNCH_CHECK();
        return;
      }
    }
    launch_pdl(gemv_kernel<M, 1, true>, grid, block, 0, launch, p);
    CUDA_LAUNCH_CHECK();
    return;
  }
  const int ks = gemv_ksplit(p, p.n);
  int64_t blocks = gemv_blocks(p, p.n);
  if (p.w2 != nullptr) {
    CHECK_MSG(gemv_ksplit(p, p.n2) == ks && p.blocks1 == blocks,
              "gemv pair: {} and {} rows split k {} and {} ways ({} blocks, {} given)", p.n, p.n2,
              ks, gemv_ksplit(p, p.n2), blocks, p.blocks1);
    blocks += gemv_blocks(p, p.n2);
  }
  const dim3 grid(static_cast<unsigned>(blocks));
  if (p.norm.x != nullptr) {
    if constexpr (M <= 2) {
      const size_t smem = norm_prologue_smem_bytes(M, p.k);
      if (ks == 1)
        launch_pdl(gemv_kernel<M, 1, false, true>, grid, block, smem, launch, p);
      else if (ks == 2)
        launch_pdl(gemv_kernel<M, 2, false, true>, grid, block, smem, launch, p);
      else
        launch_pdl(gemv_kernel<M, 4, false, true>, grid, block, smem, launch, p);
    }
    CUDA_LAUNCH_CHECK();
    return;
  }
  if (ks == 1)
    launch_pdl(gemv_kernel<M, 1, false>, grid, block, 0, launch, p);
  else if (ks == 2)
    launch_pdl(gemv_kernel<M, 2, false>, grid, block, 0, launch, p);
  else
    launch_pdl(gemv_kernel<M, 4, false>, grid, block, 0, launch, p);
  CUDA_LAUNCH_CHECK();
}

}  // namespace

// The fewest warps per row (up to p.max_ksplit) that give every SM ~48 warps of loads in flight.
int gemv_ksplit(const GemvParams& p, int64_t n) {
  const int warps = p.block_warps == 4 ? 4 : kMaxWarps;
  int ks = 1;
  while (ks < p.max_ksplit && ks < warps && n * ks < int64_t(num_sms()) * 48) ks *= 2;
  return ks;
}
int64_t gemv_blocks(const GemvParams& p, int64_t n) {
  const int warps = p.block_warps == 4 ? 4 : kMaxWarps;
  return ceil_div(n, warps / gemv_ksplit(p, n));
}

void launch_gemv(const GemvParams& p, const Launch& launch) {
  if (p.m == 0 || p.n == 0) return;
  CHECK(p.k % 8 == 0 && uintptr_t(p.x) % 16 == 0 && uintptr_t(p.w) % 16 == 0);
  CHECK(p.glu_inter == 0 || p.n == 2 * p.glu_inter);
  CHECK(p.w2 == nullptr ||
        (p.glu_inter == 0 && p.n2 > 0 && uintptr_t(p.w2) % 16 == 0 && p.out2 != nullptr));
  using Launcher = void (*)(const GemvParams&, const Launch&);
  static constexpr Launcher kByRows[kGemvMaxRows] = {
      launch_gemv_m<1>, launch_gemv_m<2>, launch_gemv_m<3>, launch_gemv_m<4>,
      launch_gemv_m<5>, launch_gemv_m<6>, launch_gemv_m<7>, launch_gemv_m<8>};
  CHECK_MSG(p.m >= 1 && p.m <= kGemvMaxRows, "gemv: {} rows (max {})", p.m, kGemvMaxRows);
  kByRows[p.m - 1](p, launch);
}

void launch_bias_add(const BiasAddParams& p, const Launch& launch) {
  const int64_t n = p.rows * p.cols;
  if (n == 0) return;
  launch_pdl(bias_add_kernel, int(std::min<int64_t>(ceil_div(n, kBiasThreads), 1 << 20)),
             kBiasThreads, 0, launch, p);
  CUDA_LAUNCH_CHECK();
}

// ---- host entries ----
// A decode GEMV: out [m, n] = x [m, k] · w [n, k]ᵀ (+ bias [n]), with the current launch tunables
// (part of a graph step's signature).
GemvParams CudaBackend::gemv_params(const Tensor& x, const Tensor& w, const float* bias,
                                    const Tensor& out, int64_t m) const {
  auto p = zeroed<GemvParams>();
  p.x = x.ptr<bf16_bits>();
  p.w = w.ptr<bf16_bits>();
  p.bias = bias;
  p.out = out.ptr<bf16_bits>();
  p.m = int(m);
  p.n = w.dim(0);
  p.k = w.dim(1);
  p.prefetch_elems = tunables_.gemv_prefetch_elems;
  p.block_warps = tunables_.gemv_block_warps;
  p.max_ksplit = tunables_.gemv_max_ksplit;
  p.pdl_early = tunables_.pdl_early;
  return p;
}

void CudaBackend::linear(const Tensor& x, const LinearWeight& w, const Tensor& out) {
  if (out.dtype == DType::kF32) return linear_f32_out(x, w, out);  // routers (moe.cu)
  if (!w.is_dense()) return linear_packed(x, w, out, false);
  const Tensor& wt = w.weight->view();
  const int64_t m = x.numel() / x.dim(-1), k = x.dim(-1), n = wt.dim(0);
  CHECK_MSG(wt.dim(1) == k, "linear: x has {} features, weight {}", k, shape_str(wt.shape));
  CHECK_EQ(out.numel(), m * n);
  check_bf16(x, "linear x");
  check_bf16(wt, "linear weight");
  check_bf16(out, "linear out");
  const float* bias = nullptr;
  if (w.bias) {
    CHECK_MSG(w.bias->view().dtype == DType::kF32, "linear: bias must be f32");
    bias = w.bias->view().ptr<float>();
  }
  if (m == 0) return;
  begin_op();
  if (tunables_.deterministic) {  // one kernel at every m (linear_det.h)
    record_gemm(x.data, wt.data, bias, out.data, m, n, k);
    return;
  }
  const bool vec_ok = k % 8 == 0 && uintptr_t(x.data) % 16 == 0 && uintptr_t(wt.data) % 16 == 0;
  if (vec_ok && dev_gemv_takes(m)) {  // a development GEMV (bench/cuda/dev)
    record(kOpGemvDev, gemv_params(x, wt, bias, out, m), dev_.gemv);
    return;
  }
  const bool gemv_ok = m <= tunables_.gemv_max_rows && vec_ok;
  if (gemv_ok) {
    const GemvParams p = gemv_params(x, wt, bias, out, m);
    if (merge_head_gemv_linear(p)) return;  // MLA's W_UV before o_proj (graph mode)
    GemvParams pair;
    if (merge_gemv_pair(p, &pair)) {
      recorder_.drop_last();
      record(kOpGemvPair, pair, launch_gemv);
      return;
    }
    GemvParams normed = p;
    if (merge_gemv_norm(&normed)) {
      recorder_.drop_last();
      record(kOpGemvNorm, normed, launch_gemv);
      return;
    }
    record(kOpGemv, p, launch_gemv);
    return;
  }
  record_gemm(x.data, wt.data, bias, out.data, m, n, k);
}

// Graph mode, with gemv_pair_fusion: when the launch just recorded is a plain GEMV on the same x
// (same rows, k and launch tunables, the same warps a row; a norm merged into it stays: every
// block of the pair runs the prologue) and neither output overlaps x or the other output, *pair
// becomes both as one launch (linear.h GemvParams::w2): the blocks compute what their own
// launches would, bit for bit, with one kernel boundary fewer.
bool CudaBackend::merge_gemv_pair(const GemvParams& p, GemvParams* pair) const {
  if (!tunables_.fusion || !tunables_.gemv_pair_fusion) return false;
  GemvParams a;
  if (!recorder_.last(kOpGemv, &a) && !recorder_.last(kOpGemvNorm, &a)) return false;
  if (a.norm.x != nullptr) {  // its norm's tensors must not overlap the second output either
    const int64_t x_bytes = int64_t(p.m) * p.k * 2, p_out = int64_t(p.m) * p.n * 2;
    if (byte_ranges_overlap(p.out, p_out, a.norm.x, x_bytes)) return false;
  }
  if (a.w2 != nullptr || a.glu_inter != 0 || p.glu_inter != 0 || a.x != p.x || a.m != p.m ||
      a.k != p.k || a.prefetch_elems != p.prefetch_elems || a.block_warps != p.block_warps ||
      a.max_ksplit != p.max_ksplit || a.pdl_early != p.pdl_early ||
      gemv_ksplit(a, a.n) != gemv_ksplit(p, p.n))
    return false;
  const int64_t x_bytes = int64_t(p.m) * p.k * 2, a_out = int64_t(a.m) * a.n * 2,
                p_out = int64_t(p.m) * p.n * 2;
  if (byte_ranges_overlap(p.out, p_out, p.x, x_bytes) ||
      byte_ranges_overlap(a.out, a_out, a.x, x_bytes) ||
      byte_ranges_overlap(p.out, p_out, a.out, a_out))
    return false;
  *pair = a;
  pair->blocks1 = int(gemv_blocks(a, a.n));
  pair->w2 = p.w;
  pair->bias2 = p.bias;
  pair->out2 = p.out;
  pair->n2 = p.n;
  return true;
}

void CudaBackend::record_gemm(const void* x, const void* w, const float* bias, void* out, int64_t m,
                              int64_t n, int64_t k) {
  if (tunables_.deterministic) {
    record_det_gemm(x, w, bias, out, false, m, n, k);
    return;
  }
  auto g = zeroed<GemmParams>();
  g.handle = cublas_handle();
  GemmOperands::dense(x, w, out, m, n, k).fill(g);
  record(kOpGemm, g, run_gemm);
  if (bias) {
    auto b = zeroed<BiasAddParams>();
    b.out = static_cast<bf16_bits*>(out);
    b.bias = bias;
    b.rows = m;
    b.cols = n;
    record(kOpBias, b, launch_bias_add);
  }
}

// The batch-invariant GEMM (deterministic mode): bias added in float32 before the one rounding.
void CudaBackend::record_det_gemm(const void* x, const void* w, const float* bias, void* out,
                                  bool out_f32, int64_t m, int64_t n, int64_t k) {
  CHECK_MSG(m < (int64_t(1) << 31) && n < (int64_t(1) << 31) && k < (int64_t(1) << 31),
            "deterministic GEMM: m {} n {} k {}", m, n, k);
  auto g = zeroed<DetGemmParams>();
  GemmOperands::dense(x, w, out, m, n, k).fill(g);
  g.bias = bias;
  g.out_f32 = out_f32 ? 1 : 0;
  CHECK_MSG(det_gemm_supported(g),
            "--enable-deterministic-inference: a linear with k {} or operands not 16-byte aligned "
            "(the batch-invariant GEMM needs k % 8 == 0)",
            k);
  record(kOpGemmDet, g, launch_det_gemm);
}

void CudaBackend::linear_silu_mul(const Tensor& x, const LinearWeight& w, const Tensor& out) {
  // Deterministic mode: the linear (batch-invariant GEMM), then silu_mul (elementwise).
  if (tunables_.deterministic) return Backend::linear_silu_mul(x, w, out);
  if (!w.is_dense()) {
    if (packed_glu_fused(x, w)) return linear_packed(x, w, out, true);
    return Backend::linear_silu_mul(x, w, out);
  }
  const Tensor& wt = w.weight->view();
  const int64_t m = x.numel() / x.dim(-1), k = x.dim(-1), n = wt.dim(0), inter = n / 2;
  CHECK_MSG(wt.dim(1) == k, "linear_silu_mul: x has {} features, weight {}", k,
            shape_str(wt.shape));
  CHECK_MSG(n % 2 == 0, "linear_silu_mul: weight {} has an odd row count", shape_str(wt.shape));
  CHECK_EQ(out.numel(), m * inter);
  const bool dev = dev_gemv_takes(m);
  const bool gemv_ok = tunables_.fusion && m > 0 && (m <= tunables_.gemv_max_rows || dev) &&
                       k % 8 == 0 && x.dtype == DType::kBF16 && wt.dtype == DType::kBF16 &&
                       out.dtype == DType::kBF16 && uintptr_t(x.data) % 16 == 0 &&
                       uintptr_t(wt.data) % 16 == 0 &&
                       (!w.bias || w.bias->view().dtype == DType::kF32);
  if (!gemv_ok) return Backend::linear_silu_mul(x, w, out);
  begin_op();
  GemvParams p = gemv_params(x, wt, w.bias ? w.bias->view().ptr<float>() : nullptr, out, m);
  p.glu_inter = inter;
  if (dev) {
    record(kOpGemvDevGlu, p, dev_.gemv);
    return;
  }
  if (merge_gemv_norm(&p)) {  // graph mode: the norm that made x (a dense MLP's post-attention)
    recorder_.drop_last();
    record(kOpGemvNorm, p, launch_gemv);
    return;
  }
  record(kOpGemvGlu, p, launch_gemv);
}

void CudaBackend::per_head_linear(const Tensor& x, int64_t x_begin, const Tensor& w,
                                  const Tensor& out, int64_t out_begin) {
  CHECK_EQ(x.rank(), 3);
  CHECK_EQ(out.rank(), 3);
  CHECK_EQ(w.rank(), 3);
  const int64_t tokens = x.dim(0), heads = x.dim(1), dx = x.dim(2), dout = out.dim(2);
  const int64_t n = w.dim(1), k = w.dim(2);
  CHECK_EQ(w.dim(0), heads);
  CHECK_EQ(out.dim(0), tokens);
  CHECK_EQ(out.dim(1), heads);
  CHECK(x_begin + k <= dx && out_begin + n <= dout);
  check_bf16(x, "per_head_linear x");
  check_bf16(w, "per_head_linear w");
  check_bf16(out, "per_head_linear out");
  if (tokens == 0) return;
  begin_op();
  // Head h (batch entry h): out[:, h, out_begin..] = x[:, h, x_begin..] · w[h]ᵀ.
  GemmOperands heads_gemm = GemmOperands::dense(x.ptr<bf16_bits>() + x_begin, w.data,
                                                out.ptr<bf16_bits>() + out_begin, tokens, n, k);
  heads_gemm.ldx = heads * dx;
  heads_gemm.ldo = heads * dout;
  heads_gemm.batch = heads;
  heads_gemm.stride_x = dx;
  heads_gemm.stride_w = n * k;
  heads_gemm.stride_o = dout;
  if (tunables_.deterministic) {  // the batch-invariant GEMM, one head per grid z
    auto d = zeroed<DetGemmParams>();
    heads_gemm.fill(d);
    CHECK_MSG(det_gemm_supported(d),
              "--enable-deterministic-inference: a per-head linear with k {}, x columns from {} of "
              "{} (the batch-invariant GEMM needs multiples of 8)",
              k, x_begin, dx);
    record(kOpGemmDet, d, launch_det_gemm);
    return;
  }
  if (tunables_.fusion && tokens <= tunables_.per_head_gemv_max_tokens) {
    auto q = zeroed<PerHeadGemvParams>();
    q.x = x.ptr<bf16_bits>() + x_begin;
    q.w = w.ptr<bf16_bits>();
    q.out = out.ptr<bf16_bits>() + out_begin;
    q.tokens = tokens;
    q.ldx = heads * dx;
    q.ldo = heads * dout;
    q.stride_x = dx;
    q.stride_o = dout;
    q.heads = int(heads);
    q.n = int(n);
    q.k = int(k);
    q.pdl_early = tunables_.pdl_early;
    per_head_gemv_set_lanes(q);
    if (per_head_gemv_fits(q)) {
      record(kOpPerHeadGemv, q, launch_per_head_gemv);
      return;
    }
  }
  auto g = zeroed<GemmParams>();
  g.handle = cublas_handle();
  heads_gemm.fill(g);
  record(kOpGemmBatched, g, run_gemm);
}

}  // namespace strata::cuda
