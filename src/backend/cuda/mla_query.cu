// MLA's decode query in one launch (mla_query.h says what, why, and why the bits are those of the
// separate launches). Grid: one cluster of `cluster` CTAs a head, then one cluster for the cache
// rows. A head's CTA r streams q rows [r · rows_per_cta, +rows_per_cta) of the head (a warp
// rows_per_cta / 8 whole rows, every load of them issued before the PDL wait: weights are never
// written by a kernel), after the q_a norm of its own; the rows meet in distributed shared
// memory; then CTA r ropes its share of the head's rope pairs and folds the head's q_nope into
// latent columns [r · latent / cluster, +latent / cluster) with the W_UK rows it also loaded
// before the wait.
#include <cuda_runtime.h>

#include <array>

#include "backend/cuda/cluster.cuh"
#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/mla_attention.h"
#include "backend/cuda/mla_inputs.cuh"
#include "backend/cuda/mla_query.h"
#include "backend/cuda/norm_prologue.cuh"
#include "backend/cuda/norm_weight.cuh"
#include "backend/cuda/per_head_gemv.h"

namespace strata::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
static_assert(kThreads == kMlaInputsThreads, "the cache rows' cluster runs mla_cache_row");
constexpr int kMaxRowsPerCta = kWarps * kMlaQueryMaxRowsPerWarp;

// The q_a norm in the one-warp kernel's order (norm.cu rms_norm_warp_kernel, k <= 256): warp m
// normalizes row m, lane l holding values l + 32j in order, the xor butterfly. Into xs [M, k]
// (shared); block 0 also stores the rows into `keep`.
template <int M>
__device__ __forceinline__ void norm_one_warp(const NormPrologue& n, int k, bf16_bits* keep,
                                              bf16_bits* xs) {
  const int lane = int(threadIdx.x) % 32, warp = int(threadIdx.x) / 32;
  if (warp < M) {
    const bf16_bits* x = n.x + int64_t(warp) * k;
    float vals[8];
    float ss = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int i = lane + j * 32;
      if (i < k) {
        vals[j] = bf16_to_float(x[i]);
        ss += vals[j] * vals[j];
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float inv = rsqrtf(ss / float(k) + n.eps);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int i = lane + j * 32;
      if (i < k) {
        const float w = n.weight_f32 ? static_cast<const float*>(n.weight)[i]
                                     : bf16_to_float(static_cast<const bf16_bits*>(n.weight)[i]);
        const bf16_bits b = float_to_bf16(w * (vals[j] * inv));
        xs[int64_t(warp) * k + i] = b;
        if (blockIdx.x == 0) keep[int64_t(warp) * k + i] = b;
      }
    }
  }
  __syncthreads();
}

// The q_a norm in the one-pass vec kernel's order (norm_prologue.cuh says which), for k <= 8 ·
// kThreads: thread i holds values [8i, 8i + 8) of each row (its weights `w` loaded before the PDL
// wait), the warps' sums added in warp order. Into xs [M, k]; block 0 also stores `keep`.
// warp_ss: M · kWarps floats.
template <int M>
__device__ __forceinline__ void norm_vec(const NormPrologue& n, int k, const float* w,
                                         bf16_bits* keep, bf16_bits* xs, float* warp_ss) {
  const int tid = int(threadIdx.x), lane = tid % 32, warp = tid / 32;
  const int nchunk = k / 8, norm_warps = (nchunk + 31) / 32;
  const bool holds = tid < nchunk;
  float v[M][8];
#pragma unroll
  for (int m = 0; m < M; ++m) {
    float ss = 0;
    if (holds) {
      unpack8(__ldg(reinterpret_cast<const uint4*>(n.x + int64_t(m) * k) + tid), v[m]);
#pragma unroll
      for (int e = 0; e < 8; ++e) ss += v[m][e] * v[m][e];
    }
    if (warp < norm_warps) {
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
      if (lane == 0) warp_ss[m * kWarps + warp] = ss;
    }
  }
  __syncthreads();
#pragma unroll
  for (int m = 0; m < M; ++m) {
    float total = 0;
    for (int i = 0; i < norm_warps; ++i) total += warp_ss[m * kWarps + i];
    const float inv = rsqrtf(total / float(k) + n.eps);
    if (holds) {
      float o[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) o[e] = w[e] * (v[m][e] * inv);
      const uint4 bits = pack8(o);
      reinterpret_cast<uint4*>(xs + int64_t(m) * k)[tid] = bits;
      if (blockIdx.x == 0) reinterpret_cast<uint4*>(keep + int64_t(m) * k)[tid] = bits;
    }
  }
  __syncthreads();
}

template <int M>
__global__ void __launch_bounds__(kThreads, 1) mla_query_kernel(MlaQueryParams p) {
  extern __shared__ __align__(16) char norm_smem[];                // the normalized q_a rows
  __shared__ __align__(16) bf16_bits q_s[M][kMaxRowsPerCta];       // this CTA's q rows
  __shared__ __align__(16) bf16_bits nope_s[M][kMlaQueryMaxNope];  // the head's q_nope
  __shared__ __align__(16) uint16_t row_s[kMlaInputsMaxLatent + 2 * kMaxRopeHalf];
  __shared__ float warp_ss[kMlaQueryMaxTokens * kWarps];
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int cs = p.cluster, heads = p.in.heads;
  const int head = int(blockIdx.x) / cs;
  const int rank = int(cluster_rank());

  if (head == heads) {  // the cache rows' cluster: no cluster barrier, no shared q
    // The latent norm's weights into L2 before the wait (never written by a kernel).
    const int wbytes = p.in.fmt.latent * (p.in.norm_f32 ? 4 : 2);
    if (rank == 0)
      for (int b = int(threadIdx.x) * 128; b < wbytes; b += kThreads * 128)
        prefetch_l2(static_cast<const char*>(p.in.norm) + b);
    pdl_enter(p.in.pdl_early);
    for (int64_t t = rank; t < p.in.tokens; t += cs) {
      if (t != rank) __syncthreads();  // the last row's encode has read row_s
      mla_cache_row(p.in, t, row_s, warp_ss);
    }
    return;
  }

  // Loads before the wait: this warp's q_b rows and its W_UK rows.
  const int k = p.k, q_stride = p.in.q_stride, rows = p.rows_per_cta;
  const int rpw = rows / kWarps, row0 = rank * rows;
  const bf16_bits* wq = p.q_b + (int64_t(head) * q_stride + row0 + warp * rpw) * k;
  uint4 wv[kMlaQueryMaxRowsPerWarp][kMlaQueryMaxSteps];
#pragma unroll
  for (int j = 0; j < kMlaQueryMaxRowsPerWarp; ++j) {
#pragma unroll
    for (int s = 0; s < kMlaQueryMaxSteps; ++s) {
      const int kk = lane * 8 + s * 256;
      if (j < rpw && kk < k) wv[j][s] = __ldcs(reinterpret_cast<const uint4*>(wq + j * k + kk));
    }
  }
  const int R = p.in.fmt.latent, P = p.in.fmt.rope, nope = p.nope;
  const int L = p.uk_lanes, uk_rows = 32 / L, sub = lane / L, sl = lane % L;
  const int cols = R / cs, col0 = rank * cols;
  const bf16_bits* wuk = p.w_uk + (int64_t(head) * R + col0) * nope;
  uint4 uk[kMlaQueryMaxUkPasses][kMlaQueryMaxUkPieces];
#pragma unroll
  for (int ps = 0; ps < kMlaQueryMaxUkPasses; ++ps) {
    const int c = (ps * kWarps + warp) * uk_rows + sub;
#pragma unroll
    for (int i = 0; i < kMlaQueryMaxUkPieces; ++i) {
      const int k0 = sl * 8 + i * L * 8;
      if (c < cols && k0 < nope)
        uk[ps][i] = *reinterpret_cast<const uint4*>(wuk + int64_t(c) * nope + k0);
    }
  }
  // The vec norm's weights too (thread i: values [8i, 8i + 8)).
  const int nchunk = k / 8;
  float nw[8];
  if (p.norm_vec && int(threadIdx.x) < nchunk)
    norm_weight8(p.norm.weight, p.norm.weight_f32, threadIdx.x, nw);
  pdl_enter(p.in.pdl_early);

  // q_a's norm, then this warp's q rows: one warp a row as the decode GEMV sums it.
  bf16_bits* xn = reinterpret_cast<bf16_bits*>(norm_smem);
  if (p.norm_vec)
    norm_vec<M>(p.norm, k, nw, p.q_a_normed, xn, warp_ss);
  else
    norm_one_warp<M>(p.norm, k, p.q_a_normed, xn);
#pragma unroll
  for (int j = 0; j < kMlaQueryMaxRowsPerWarp; ++j) {
    float acc[M];
#pragma unroll
    for (int m = 0; m < M; ++m) acc[m] = 0;
#pragma unroll
    for (int s = 0; s < kMlaQueryMaxSteps; ++s) {
      const int kk = lane * 8 + s * 256;
      if (j < rpw && kk < k) {
        float wf[8];
        unpack8(wv[j][s], wf);
#pragma unroll
        for (int m = 0; m < M; ++m) {
          float xf[8];
          unpack8(*reinterpret_cast<const uint4*>(xn + m * k + kk), xf);
          acc[m] += dot8(wf, xf);
        }
      }
    }
#pragma unroll
    for (int m = 0; m < M; ++m) {
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) acc[m] += __shfl_xor_sync(0xffffffffu, acc[m], o);
    }
    if (j < rpw && lane == 0) {
      const int r = warp * rpw + j, d = row0 + r;
#pragma unroll
      for (int m = 0; m < M; ++m) {
        const bf16_bits b = float_to_bf16(acc[m] + 0.0f);  // the GEMV's bias-free epilogue
        q_s[m][r] = b;
        if (d < nope) p.in.q[(int64_t(m) * heads + head) * q_stride + d] = b;
      }
    }
  }
  cluster_sync();  // every CTA's q rows in its q_s

  // The head's q_nope gathered (16-byte pieces: rows_per_cta is a multiple of 8), and this
  // CTA's share of the rope pairs: rotated into q and q_latent's rope columns.
  const int pieces = nope / 8;
  for (int i = int(threadIdx.x); i < M * pieces; i += kThreads) {
    const int m = i / pieces, d = (i - m * pieces) * 8;
    const uint32_t at = uint32_t(__cvta_generic_to_shared(&q_s[m][d % rows]));
    *reinterpret_cast<uint4*>(&nope_s[m][d]) = ld_cluster_v4(cluster_map(at, uint32_t(d / rows)));
  }
  const int half = p.in.half;
  for (int idx = rank * kThreads + int(threadIdx.x); idx < M * half; idx += cs * kThreads) {
    const int m = idx / half, i = idx - m * half;
    int d0, d1;
    mla_rope_pair_dims(p.in, i, &d0, &d1);
    const int e0 = nope + d0, e1 = nope + d1;
    const uint32_t a0 = uint32_t(__cvta_generic_to_shared(&q_s[m][e0 % rows]));
    const uint32_t a1 = uint32_t(__cvta_generic_to_shared(&q_s[m][e1 % rows]));
    const float x0 = bf16_to_float(ld_cluster_u16(cluster_map(a0, uint32_t(e0 / rows))));
    const float x1 = bf16_to_float(ld_cluster_u16(cluster_map(a1, uint32_t(e1 / rows))));
    bf16_bits o0, o1;
    rope_pair(x0, x1, p.in.positions[m], p.in.inv_freq[i], p.in.attention_factor, &o0, &o1);
    bf16_bits* qh = p.in.q + (int64_t(m) * heads + head) * q_stride;
    bf16_bits* lh = p.in.q_latent + (int64_t(m) * heads + head) * (R + P) + R;
    qh[e0] = o0;
    qh[e1] = o1;
    lh[d0] = o0;
    lh[d1] = o1;
  }
  cluster_arrive();  // done with the other CTAs' q_s
  __syncthreads();   // nope_s complete

  // W_UK: latent column col0 + c of the head, per_head_gemv's sum of L lanes.
#pragma unroll
  for (int ps = 0; ps < kMlaQueryMaxUkPasses; ++ps) {
    const int c = (ps * kWarps + warp) * uk_rows + sub;
    float acc[M];
#pragma unroll
    for (int m = 0; m < M; ++m) acc[m] = 0.0f;
    if (c < cols) {
#pragma unroll
      for (int i = 0; i < kMlaQueryMaxUkPieces; ++i) {
        const int k0 = sl * 8 + i * L * 8;
        if (k0 < nope) {
          float w[8];
          unpack8(uk[ps][i], w);
#pragma unroll
          for (int m = 0; m < M; ++m) {
            float x[8];
            unpack8(*reinterpret_cast<const uint4*>(&nope_s[m][k0]), x);
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[m] = fmaf(w[e], x[e], acc[m]);
          }
        }
      }
    }
#pragma unroll
    for (int m = 0; m < M; ++m)
      for (int o = L / 2; o > 0; o >>= 1) acc[m] += __shfl_xor_sync(0xffffffffu, acc[m], o);
    if (c < cols && sl == 0) {
#pragma unroll
      for (int m = 0; m < M; ++m)
        p.in.q_latent[(int64_t(m) * heads + head) * (R + P) + col0 + c] = float_to_bf16(acc[m]);
    }
  }
  cluster_wait();  // no CTA leaves while another may still read its q_s
}

// How a head's work splits: `lanes` (per_head_gemv's for k = nope) share a W_UK row, and the
// head's cluster takes `cluster` CTAs, the most (up to the portable 8) that split its q rows into
// whole 8-row pieces of at most kMlaQueryMaxRowsPerWarp rows a warp and its latent columns evenly,
// with W_UK's rows within kMlaQueryMaxUkPasses a warp (0: none does).
struct HeadSplit {
  int cluster, lanes;
};
HeadSplit head_split(int64_t q_stride, int64_t nope, int64_t latent) {
  PerHeadGemvParams g{};
  g.k = int(nope);
  per_head_gemv_set_lanes(g);
  for (int cs = 8; cs >= 1; cs /= 2) {
    if (q_stride % (int64_t(cs) * kWarps) != 0 || latent % cs != 0) continue;
    if (q_stride / (int64_t(cs) * kWarps) > kMlaQueryMaxRowsPerWarp) continue;
    if (ceil_div(latent / cs, int64_t(kWarps) * (32 / g.lanes)) > kMlaQueryMaxUkPasses) continue;
    return {cs, g.lanes};
  }
  return {0, g.lanes};
}

template <int M>
void launch_m(const MlaQueryParams& p, const Launch& launch) {
  const dim3 grid(unsigned((p.in.heads + 1) * p.cluster));
  launch_pdl_cluster(mla_query_kernel<M>, grid, dim3(kThreads), norm_prologue_smem_bytes(M, p.k),
                     launch, p.cluster, p);
  CUDA_LAUNCH_CHECK();
}

}  // namespace

bool mla_query_fits(int64_t tokens, int64_t k, int64_t heads, int64_t q_stride, int64_t nope,
                    int64_t latent) {
  if (tokens < 1 || tokens > kMlaQueryMaxTokens || heads < 1) return false;
  if (k < 8 || k % 8 != 0 || k > int64_t(kMlaQueryMaxSteps) * 256) return false;
  if (nope < 8 || nope % 8 != 0 || nope > kMlaQueryMaxNope || nope >= q_stride) return false;
  const HeadSplit h = head_split(q_stride, nope, latent);
  return ceil_div(nope, int64_t(h.lanes) * 8) <= kMlaQueryMaxUkPieces && h.cluster > 0;
}

int mla_query_active_clusters(int64_t tokens, int64_t k, int64_t heads, int64_t q_stride,
                              int64_t nope, int64_t latent) {
  const int cs = head_split(q_stride, nope, latent).cluster;
  int active = 0;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(unsigned((heads + 1) * cs));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = norm_prologue_smem_bytes(int(tokens), k);
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = unsigned(cs);
  attr.val.clusterDim.y = attr.val.clusterDim.z = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  const cudaError_t e = tokens == 1
                            ? cudaOccupancyMaxActiveClusters(&active, mla_query_kernel<1>, &cfg)
                            : cudaOccupancyMaxActiveClusters(&active, mla_query_kernel<2>, &cfg);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return active;
}

void mla_query_set_split(MlaQueryParams& p) {
  const HeadSplit h = head_split(p.in.q_stride, p.nope, p.in.fmt.latent);
  CHECK(h.cluster > 0);
  p.uk_lanes = h.lanes;
  p.cluster = h.cluster;
  p.rows_per_cta = p.in.q_stride / p.cluster;
}

void launch_mla_query(const MlaQueryParams& p, const Launch& launch) {
  CHECK(p.in.tokens >= 1 && p.in.tokens <= kMlaQueryMaxTokens && p.cluster > 0);
  if (p.in.tokens == 1)
    launch_m<1>(p, launch);
  else
    launch_m<2>(p, launch);
}

// ---- host entry ----
bool CudaBackend::mla_query(const MlaQueryOperands& o, KvStorage& kv, int layer,
                            const AttentionMetadata& meta) {
  if (!tunables_.fusion || !tunables_.mla_query_fusion || tunables_.deterministic) return false;
  const LinearWeight& qb = o.q_b;
  if (!qb.is_dense() || qb.bias || qb.stack != 1) return false;
  const Tensor& wt = qb.weight->view();
  const Tensor &q_a = o.q_a, &q = o.q;
  if (q_a.rank() != 2 || q.rank() != 3 || wt.rank() != 2 || o.w_uk.rank() != 3) return false;
  const int64_t t = q_a.dim(0), k = q_a.dim(1), heads = q.dim(1), q_stride = q.dim(2);
  const int64_t nope = o.args.q_rope_offset, latent = o.kv_norm.numel();
  const auto aligned = [](const void* a) { return uintptr_t(a) % 16 == 0; };
  const bool shapes = q_a.dtype == DType::kBF16 && wt.dtype == DType::kBF16 &&
                      o.w_uk.dtype == DType::kBF16 && o.q_a_normed.dtype == DType::kBF16 &&
                      q_a.is_contiguous() && wt.is_contiguous() && o.w_uk.is_contiguous() &&
                      o.q_a_normed.is_contiguous() && o.q_a_normed.numel() == t * k &&
                      (o.q_a_norm.dtype == DType::kBF16 || o.q_a_norm.dtype == DType::kF32) &&
                      o.q_a_norm.numel() == k && wt.dim(0) == heads * q_stride && wt.dim(1) == k &&
                      o.w_uk.dim(0) == heads && o.w_uk.dim(1) == latent && o.w_uk.dim(2) == nope &&
                      aligned(q_a.data) && aligned(wt.data) && aligned(o.w_uk.data) &&
                      aligned(o.q_a_normed.data) && o.args.rope.rotary_dim == q_stride - nope &&
                      !byte_ranges_overlap(q_a.data, t * k * 2, o.q_a_normed.data, t * k * 2);
  if (!shapes || !mla_inputs_fusable(o.kv_row, o.kv_norm, q, o.q_latent, o.args, kv, meta))
    return false;
  // The q_a norm in an order the kernel follows (that of the separate norm's kernel).
  auto np = zeroed<RmsNormParams>();
  np.x = q_a.ptr<bf16_bits>();
  np.weight = o.q_a_norm.data;
  np.out = o.q_a_normed.ptr<bf16_bits>();
  np.rows = t;
  np.dim = int(k);
  const RmsNormKernel norm_kernel = rms_norm_kernel_for(np);
  if (norm_kernel != RmsNormKernel::kVecOnePass && norm_kernel != RmsNormKernel::kWarp)
    return false;
  if (!mla_query_fits(t, k, heads, q_stride, nope, latent)) return false;
  // One wave (a head's CTAs wait on each other): asked of the driver once a shape, as this runs
  // at every layer's recording.
  const std::array<int64_t, 6> shape{t, k, heads, q_stride, nope, latent};
  auto wave = mla_query_one_wave_.find(shape);
  if (wave == mla_query_one_wave_.end())
    wave = mla_query_one_wave_
               .emplace(shape,
                        mla_query_active_clusters(t, k, heads, q_stride, nope, latent) >= heads + 1)
               .first;
  if (!wave->second) return false;
  begin_op();
  auto p = zeroed<MlaQueryParams>();
  p.in = mla_inputs_params(o.kv_row, o.kv_norm, q, o.q_latent, o.args, kv, layer, meta);
  p.norm.x = q_a.ptr<bf16_bits>();
  p.norm.weight = o.q_a_norm.data;
  p.norm.eps = o.q_a_eps;
  p.norm.weight_f32 = o.q_a_norm.dtype == DType::kF32;
  p.q_b = wt.ptr<bf16_bits>();
  p.w_uk = o.w_uk.ptr<bf16_bits>();
  p.q_a_normed = o.q_a_normed.ptr<bf16_bits>();
  p.k = int(k);
  p.nope = int(nope);
  p.norm_vec = norm_kernel == RmsNormKernel::kVecOnePass;
  mla_query_set_split(p);
  record(kOpMlaQuery, p, launch_mla_query);
  return true;
}

}  // namespace strata::cuda
