// MLA's decode query of a layer without q_lora in one launch (mla_query_proj.h says what, why,
// how the cache rows find the last CTA, and why the bits are those of the separate launches).
// Grid: one cluster of `cluster` CTAs a head. CTA g (of G): before the PDL wait, its kv_a rows
// [g · (R + P) / G, (g + 1) · (R + P) / G), its slice of the head's q_proj rows and its share of
// W_UK's latent columns into shared memory by bulk copies; after it, h into shared memory, its
// kv_a rows, its q rows, the head's tail (mla_query_head.cuh), and the cache rows if it is the
// last CTA done with its kv_a rows.
#include <cuda_runtime.h>

#include <array>

#include "backend/cuda/bulk_copy.cuh"
#include "backend/cuda/cluster.cuh"
#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/l2_prefetch.cuh"
#include "backend/cuda/mla_inputs.cuh"
#include "backend/cuda/mla_query.h"
#include "backend/cuda/mla_query_head.cuh"
#include "backend/cuda/mla_query_proj.h"
#include "core/log.h"

namespace strata::cuda {
namespace {

using mla_query_head::kThreads;
using mla_query_head::kWarps;
constexpr int kMaxRowsPerCta = kWarps * kMlaQueryMaxRowsPerWarp;
constexpr int kBarrierBytes = 16;  // the two mbarriers at the front of dynamic shared memory

// One GEMV row as gemv_kernel sums it at one warp a row: lane l's 8-value steps at l · 8 + 256 s
// in order (dot8, then added), the xor butterfly. w (a row of k) and x ([M, k]) in shared memory.
template <int M>
__device__ __forceinline__ void gemv_row(const bf16_bits* w, const bf16_bits* x, int k, int lane,
                                         float (&acc)[M]) {
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = 0.0f;
  for (int kk = lane * 8; kk < k; kk += 256) {
    float wf[8];
    unpack8(*reinterpret_cast<const uint4*>(w + kk), wf);
#pragma unroll
    for (int m = 0; m < M; ++m) {
      float xf[8];
      unpack8(*reinterpret_cast<const uint4*>(x + m * k + kk), xf);
      acc[m] += dot8(wf, xf);
    }
  }
#pragma unroll
  for (int m = 0; m < M; ++m) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc[m] += __shfl_xor_sync(0xffffffffu, acc[m], o);
  }
}

struct SmemLayout {  // dynamic shared memory, in bf16 elements after the barriers
  int64_t x, kv, q, uk, end;
};
__host__ __device__ __forceinline__ SmemLayout smem_layout(int tokens, int k, int kv_rows_max,
                                                           int rows, int cols, int nope) {
  SmemLayout l;
  l.x = 0;
  l.kv = l.x + int64_t(tokens) * k;
  l.q = l.kv + int64_t(kv_rows_max) * k;
  l.uk = l.q + int64_t(rows) * k;
  l.end = l.uk + int64_t(cols) * nope;
  return l;
}

template <int M>
__global__ void __launch_bounds__(kThreads, 1) mla_query_proj_kernel(MlaQueryProjParams p) {
  extern __shared__ __align__(128) char smem[];
  __shared__ __align__(16) bf16_bits q_s[M][kMaxRowsPerCta];       // this CTA's q rows
  __shared__ __align__(16) bf16_bits nope_s[M][kMlaQueryMaxNope];  // the head's q_nope
  __shared__ __align__(16) uint16_t row_s[kMlaInputsMaxLatent + 2 * kMaxRopeHalf];
  __shared__ float warp_ss[kWarps];
  __shared__ int last;  // this CTA makes the cache rows
  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const int cs = p.cluster, k = p.k, rows = p.rows_per_cta, nope = p.nope;
  const int head = int(blockIdx.x) / cs, rank = int(cluster_rank());
  const int R = p.in.fmt.latent, kv_total = R + p.in.fmt.rope;
  const int ctas = int(gridDim.x), g = int(blockIdx.x);
  const int kv0 = g * kv_total / ctas, kv_n = (g + 1) * kv_total / ctas - kv0;
  const mla_query_head::Share share{head, rank, cs, rows, nope, p.uk_lanes, R / cs};

  const SmemLayout lay = smem_layout(M, k, p.kv_rows_max, rows, share.cols, nope);
  bf16_bits* base = reinterpret_cast<bf16_bits*>(smem + kBarrierBytes);
  bf16_bits *x_s = base + lay.x, *kv_w = base + lay.kv, *q_w = base + lay.q, *uk_w = base + lay.uk;
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem);
  const uint32_t bar_kv = smem_addr(&bars[0]), bar_q = smem_addr(&bars[1]);
  if (tid == 0) {
    mbar_init(bar_kv, 1);
    mbar_init(bar_q, 2);  // the q rows' copies and W_UK's
    mbar_init_fence();
  }
  __syncthreads();
  // Weights before the wait (never written by a kernel), streamed once: evict first from L2.
  if (tid == 0) {
    const uint64_t policy = l2_evict_first_policy();
    bulk_copy_into_smem(smem_addr(kv_w), p.kv_a + int64_t(kv0) * k, uint32_t(kv_n * k * 2), bar_kv,
                        policy);
    const int64_t q_row0 = int64_t(head) * p.in.q_stride + int64_t(rank) * rows;
    bulk_copy_into_smem(smem_addr(q_w), p.q_proj + q_row0 * k, uint32_t(rows * k * 2), bar_q,
                        policy);
    const int64_t uk_row0 = int64_t(head) * R + share.col0();
    bulk_copy_into_smem(smem_addr(uk_w), p.w_uk + uk_row0 * nope, uint32_t(share.cols * nope * 2),
                        bar_q, policy);
  }
  pdl_enter(p.in.pdl_early);
  // After the wait: the predecessor (the layer's input norm) streams nothing more.
  if (tid == 0) l2_prefetch_share(p.l2, blockIdx.x, gridDim.x);
  for (int i = tid; i < M * k / 8; i += kThreads)
    reinterpret_cast<uint4*>(x_s)[i] = __ldg(reinterpret_cast<const uint4*>(p.x) + i);
  __syncthreads();

  // kv_a's rows kv0.. into kv_row (the GEMV's bias-free epilogue: + 0.0f), then this CTA counts
  // itself done; the last to do so (every kv_a row stored) makes the cache rows below.
  mbar_wait(bar_kv, 0);
  for (int r = warp; r < kv_n; r += kWarps) {  // warp-uniform
    float acc[M];
    gemv_row<M>(kv_w + int64_t(r) * k, x_s, k, lane, acc);
    if (lane == 0) {
#pragma unroll
      for (int m = 0; m < M; ++m)
        p.in.kv_row[int64_t(m) * p.in.kv_stride + kv0 + r] = float_to_bf16(acc[m] + 0.0f);
      __threadfence();  // the row visible to the GPU before the count below
    }
  }
  __syncthreads();
  if (tid == 0) {
    last = atomicAdd(p.done, 1u) == unsigned(ctas - 1);
    if (last) {
      atomicExch(p.done, 0u);  // every CTA has counted: zero for the next launch
      __threadfence();         // the other CTAs' rows are read after their counts
    }
  }

  // This CTA's q rows: a warp rows / kWarps whole rows, as the GEMV sums them.
  mbar_wait(bar_q, 0);
  const int rpw = rows / kWarps;
  for (int j = 0; j < rpw; ++j) {
    const int r = warp * rpw + j, d = rank * rows + r;
    float acc[M];
    gemv_row<M>(q_w + int64_t(r) * k, x_s, k, lane, acc);
    if (lane == 0) {
#pragma unroll
      for (int m = 0; m < M; ++m) {
        const bf16_bits b = float_to_bf16(acc[m] + 0.0f);
        q_s[m][r] = b;
        if (d < nope) p.in.q[(int64_t(m) * p.in.heads + head) * p.in.q_stride + d] = b;
      }
    }
  }
  cluster_arrive();  // this CTA's q rows in its q_s
  __syncthreads();   // `last` read below
  if (last) {
    // The cache rows (mla_cache_row reads kv_row through L2: other CTAs wrote it).
    for (int64_t t = 0; t < p.in.tokens; ++t) {
      if (t != 0) __syncthreads();  // the last row's encode has read row_s
      mla_cache_row(p.in, t, row_s, warp_ss);
    }
  }
  cluster_wait();  // every CTA's q rows
  mla_query_head::finish<M>(p.in, share, &q_s[0][0], kMaxRowsPerCta, nope_s, [&](int ps, int i) {
    const int c = share.uk_col(ps, warp, lane);
    return *reinterpret_cast<const uint4*>(uk_w + int64_t(c) * nope + share.uk_k0(i, lane));
  });
  cluster_wait();  // no CTA leaves while another may still read its q_s
}

void init_kernels() {
  allow_max_dynamic_smem(mla_query_proj_kernel<1>);
  allow_max_dynamic_smem(mla_query_proj_kernel<2>);
}

void init_once() {
  static PerDeviceOnce limits;  // the kernels' shared-memory limits
  limits.run(init_kernels);
}

size_t smem_bytes(const MlaQueryProjParams& p) {
  const SmemLayout l = smem_layout(int(p.in.tokens), p.k, p.kv_rows_max, p.rows_per_cta,
                                   p.in.fmt.latent / p.cluster, p.nope);
  return size_t(kBarrierBytes + 2 * l.end);
}

}  // namespace

bool mla_query_proj_plan(int64_t tokens, int64_t k, int64_t heads, int64_t q_stride, int64_t nope,
                         int64_t latent, int64_t rope, MlaQueryProjParams& p) {
  if (tokens < 1 || tokens > kMlaQueryProjMaxTokens || heads < 1) return false;
  if (k < 8 || k % 8 != 0 || k > (int64_t(1) << 20) || nope < 8 || nope % 8 != 0 ||
      nope > kMlaQueryMaxNope || nope >= q_stride)
    return false;
  const MlaQueryHeadSplit h = mla_query_head_split(q_stride, nope, latent);
  if (h.cluster == 0 || ceil_div(nope, int64_t(h.lanes) * 8) > kMlaQueryMaxUkPieces) return false;
  const int64_t ctas = heads * h.cluster;
  if (ctas > int64_t(1) << 16) return false;
  p.k = int(k);
  p.nope = int(nope);
  p.cluster = h.cluster;
  p.uk_lanes = h.lanes;
  p.rows_per_cta = int(q_stride / h.cluster);
  p.kv_rows_max = int(ceil_div(latent + rope, ctas));
  return true;
}

bool mla_query_proj_one_wave(int64_t tokens, int64_t heads, int64_t latent,
                             const MlaQueryProjParams& p) {
  init_once();
  const SmemLayout l =
      smem_layout(int(tokens), p.k, p.kv_rows_max, p.rows_per_cta, int(latent / p.cluster), p.nope);
  const int64_t smem = kBarrierBytes + 2 * l.end;
  const int allowed = tokens == 1 ? max_dynamic_smem(mla_query_proj_kernel<1>)
                                  : max_dynamic_smem(mla_query_proj_kernel<2>);
  if (smem > allowed) return false;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(unsigned(heads * p.cluster));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = size_t(smem);
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = unsigned(p.cluster);
  attr.val.clusterDim.y = attr.val.clusterDim.z = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  int active = 0;
  const cudaError_t e =
      tokens == 1 ? cudaOccupancyMaxActiveClusters(&active, mla_query_proj_kernel<1>, &cfg)
                  : cudaOccupancyMaxActiveClusters(&active, mla_query_proj_kernel<2>, &cfg);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return active >= heads;
}

void launch_mla_query_proj(const MlaQueryProjParams& p, const Launch& launch) {
  CHECK(p.in.tokens >= 1 && p.in.tokens <= kMlaQueryProjMaxTokens && p.cluster > 0);
  init_once();
  const dim3 grid(unsigned(p.in.heads * p.cluster));
  if (p.in.tokens == 1)
    launch_pdl_cluster(mla_query_proj_kernel<1>, grid, dim3(kThreads), smem_bytes(p), launch,
                       p.cluster, p);
  else
    launch_pdl_cluster(mla_query_proj_kernel<2>, grid, dim3(kThreads), smem_bytes(p), launch,
                       p.cluster, p);
  CUDA_LAUNCH_CHECK();
}

// ---- host entry ----
bool CudaBackend::mla_query_proj(const MlaQueryProjOperands& o, KvStorage& kv, int layer,
                                 const AttentionMetadata& meta) {
  if (!tunables_.fusion || !tunables_.mla_query_proj_fusion || tunables_.deterministic)
    return false;
  const Tensor &h = o.h, &q = o.q, &kv_row = o.kv_row;
  const LinearWeight &qp = o.q_proj, &kva = o.kv_a;
  if (!qp.is_dense() || qp.bias || qp.stack != 1 || !kva.is_dense() || kva.bias || kva.stack != 1)
    return false;
  const Tensor &wq = qp.weight->view(), &wkv = kva.weight->view();
  if (h.rank() != 2 || q.rank() != 3 || kv_row.rank() != 2 || wq.rank() != 2 || wkv.rank() != 2 ||
      o.w_uk.rank() != 3)
    return false;
  const int64_t t = h.dim(0), k = h.dim(1), heads = q.dim(1), q_stride = q.dim(2);
  const int64_t nope = o.args.q_rope_offset, latent = o.kv_norm.numel(), width = kv_row.dim(1);
  // The separate path's q_proj and kv_a are one-warp-a-row GEMVs at these tokens (the bits).
  if (t > tunables_.gemv_max_rows || tunables_.gemv_max_ksplit != 1) return false;
  const auto aligned = [](const void* a) { return uintptr_t(a) % 16 == 0; };
  const bool shapes =
      h.dtype == DType::kBF16 && wq.dtype == DType::kBF16 && wkv.dtype == DType::kBF16 &&
      o.w_uk.dtype == DType::kBF16 && kv_row.dtype == DType::kBF16 && h.is_contiguous() &&
      wq.is_contiguous() && wkv.is_contiguous() && o.w_uk.is_contiguous() &&
      kv_row.is_contiguous() && kv_row.dim(0) == t && wq.dim(0) == heads * q_stride &&
      wq.dim(1) == k && wkv.dim(0) == width && wkv.dim(1) == k && o.w_uk.dim(0) == heads &&
      o.w_uk.dim(1) == latent && o.w_uk.dim(2) == nope && aligned(h.data) && aligned(wq.data) &&
      aligned(wkv.data) && aligned(o.w_uk.data) && o.args.rope.rotary_dim == q_stride - nope &&
      !byte_ranges_overlap(h.data, t * k * 2, kv_row.data, t * width * 2) &&
      !byte_ranges_overlap(h.data, t * k * 2, q.data, t * heads * q_stride * 2) &&
      !byte_ranges_overlap(h.data, t * k * 2, o.q_latent.data, o.q_latent.numel() * 2);
  if (!shapes || width != latent + o.args.rope.rotary_dim ||
      !mla_inputs_fusable(kv_row, o.kv_norm, q, o.q_latent, o.args, kv, meta))
    return false;
  auto p = zeroed<MlaQueryProjParams>();
  const int64_t rope = o.args.rope.rotary_dim;
  if (!mla_query_proj_plan(t, k, heads, q_stride, nope, latent, rope, p)) return false;
  // Each CTA's weights in shared memory, every cluster resident at once (a second wave would
  // double the launch's latency): asked of the driver once a shape, as this runs at every layer's
  // recording.
  const std::array<int64_t, 7> shape{t, k, heads, q_stride, nope, latent, rope};
  auto wave = mla_query_proj_one_wave_.find(shape);
  if (wave == mla_query_proj_one_wave_.end()) {
    wave =
        mla_query_proj_one_wave_.emplace(shape, mla_query_proj_one_wave(t, heads, latent, p)).first;
    if (!wave->second)
      LOG_INFO(
          "mla_query_proj: {} clusters of {} CTAs ({} tokens, hidden {}) are not resident at once "
          "on this GPU; the q_proj and kv_a GEMVs, W_UK and the attention inputs run as separate "
          "launches",
          heads, p.cluster, t, k);
  }
  if (!wave->second) return false;
  begin_op();
  p.in = mla_inputs_params(kv_row, o.kv_norm, q, o.q_latent, o.args, kv, layer, meta);
  p.x = h.ptr<bf16_bits>();
  p.q_proj = wq.ptr<bf16_bits>();
  p.kv_a = wkv.ptr<bf16_bits>();
  p.w_uk = o.w_uk.ptr<bf16_bits>();
  p.done = mla_query_proj_done_;
  p.l2 = take_l2_prefetch();  // the layer's hints (where it declines, W_UK's launch takes them)
  record(kOpMlaQueryProj, p, launch_mla_query_proj);
  return true;
}

}  // namespace strata::cuda
