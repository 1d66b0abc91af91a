// Paged decode attention (one new token per sequence), GQA-aware and split-KV.
//
// Grid (splits, kv_heads, seqs); 4 warps. Each K/V row of the kv head is read once per block and
// serves all `group` query heads that share it. D/8 lanes hold one token's row (16 bytes each),
// so a warp walks 32/(D/8) tokens at a time, each lane group keeping its own online softmax; the
// block merges its partial states in shared memory. With several splits, each block writes an
// unnormalized partial (o, max, sum) and a second kernel merges the splits; the grid depends only
// on the split count, never on the lengths, so a decode step can be replayed as a CUDA graph.
#include <cfloat>

#include "backend/cuda/common.cuh"

namespace strata::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kUnroll = 2;

template <int D>
struct DecodeShape {
  static constexpr int kLanes = D / 8;               // lanes per token row
  static constexpr int kTokensPerWarp = 32 / kLanes;
  static constexpr int kTokensPerIter = kWarps * kTokensPerWarp;
};

template <int D, int GM>
__global__ void __launch_bounds__(kWarps * 32) decode_kernel(AttentionParams p) {
  pdl_wait();
  pdl_trigger();
  using S = DecodeShape<D>;
  constexpr int L = S::kLanes;
  __shared__ float sm_ml[S::kTokensPerIter][GM][2];
  __shared__ float sm_acc[S::kTokensPerIter][GM][D];

  const int split = blockIdx.x, kvh = blockIdx.y, s = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int sub = lane / L, part = lane % L;
  const int group = p.heads / p.kv_heads;
  const int len = p.meta.kv_lens[s];
  const int row = p.meta.q_indptr[s];
  const int begin = split * p.split_len;
  const int end = min(len, begin + p.split_len);
  const int page_size = p.meta.page_size;
  const int32_t* pages = p.meta.page_indices + p.meta.page_indptr[s];
  const int64_t kdim = int64_t(p.kv_heads) * D;
  const int64_t col = int64_t(kvh) * D + part * 8;

  float q[GM][8], acc[GM][8], m[GM], l[GM];
  const float qscale = p.scale_log2 * p.k_scale;
#pragma unroll
  for (int g = 0; g < GM; ++g) {
    m[g] = -INFINITY;
    l[g] = 0;
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[g][e] = 0;
    if (g < group) {
      const uint4 qv = *reinterpret_cast<const uint4*>(
          p.q + (int64_t(row) * p.heads + kvh * group + g) * D + part * 8);
      unpack8(qv, q[g]);
#pragma unroll
      for (int e = 0; e < 8; ++e) q[g][e] *= qscale;
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) q[g][e] = 0;
    }
  }

  for (int base = begin; base < end; base += S::kTokensPerIter * kUnroll) {
    uint4 kv[kUnroll], vv[kUnroll];
    bool valid[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int j = base + u * S::kTokensPerIter + warp * S::kTokensPerWarp + sub;
      valid[u] = j < end;
      kv[u] = vv[u] = make_uint4(0, 0, 0, 0);
      if (valid[u]) {
        const int64_t slot = int64_t(pages[j / page_size]) * page_size + j % page_size;
        kv[u] = __ldcs(reinterpret_cast<const uint4*>(p.k_cache + slot * kdim + col));
        vv[u] = __ldcs(reinterpret_cast<const uint4*>(p.v_cache + slot * kdim + col));
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      float kf[8], vf[8];
      unpack8(kv[u], kf);
      unpack8(vv[u], vf);
#pragma unroll
      for (int g = 0; g < GM; ++g) {
        float dot = 0;
#pragma unroll
        for (int e = 0; e < 8; ++e) dot = fmaf(q[g][e], kf[e], dot);
#pragma unroll
        for (int o = L / 2; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
        if (valid[u] && g < group) {
          const float m_new = fmaxf(m[g], dot);
          const float c = exp2f(m[g] - m_new), pr = exp2f(dot - m_new);
          l[g] = l[g] * c + pr;
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[g][e] = fmaf(acc[g][e], c, pr * vf[e]);
          m[g] = m_new;
        }
      }
    }
  }

  const int pi = warp * S::kTokensPerWarp + sub;
#pragma unroll
  for (int g = 0; g < GM; ++g) {
#pragma unroll
    for (int e = 0; e < 8; ++e) sm_acc[pi][g][part * 8 + e] = acc[g][e];
    if (part == 0) {
      sm_ml[pi][g][0] = m[g];
      sm_ml[pi][g][1] = l[g];
    }
  }
  __syncthreads();

  for (int idx = threadIdx.x; idx < group * D; idx += kWarps * 32) {
    const int g = idx / D, d = idx % D;
    float mx = -INFINITY;
    for (int i = 0; i < S::kTokensPerIter; ++i) mx = fmaxf(mx, sm_ml[i][g][0]);
    float sum = 0, o = 0;
    if (mx != -INFINITY) {
      for (int i = 0; i < S::kTokensPerIter; ++i) {
        const float w = exp2f(sm_ml[i][g][0] - mx);
        sum += sm_ml[i][g][1] * w;
        o += sm_acc[i][g][d] * w;
      }
    }
    const int h = kvh * group + g;
    if (p.num_splits == 1) {
      p.out[(int64_t(row) * p.heads + h) * D + d] = float_to_bf16(o / sum * p.v_scale);
    } else {
      const int64_t at = (int64_t(s) * p.heads + h) * p.num_splits + split;
      p.partial_o[at * D + d] = o;
      if (d == 0) {
        p.partial_ml[at * 2] = mx;
        p.partial_ml[at * 2 + 1] = sum;
      }
    }
  }
}

// Merges the splits of one (sequence, head): blockDim = head_dim. The splits' (max, sum) pairs
// are staged in shared memory first, so the per-split loop has no dependent global loads.
__global__ void combine_kernel(AttentionParams p) {
  pdl_wait();
  pdl_trigger();
  extern __shared__ float sm[];  // [num_splits] max, then [num_splits] weight
  float* sm_m = sm;
  float* sm_w = sm + p.num_splits;
  const int sh = blockIdx.x;  // s · heads + h
  const int s = sh / p.heads, h = sh % p.heads, d = threadIdx.x;
  const float* ml = p.partial_ml + int64_t(sh) * p.num_splits * 2;
  for (int i = d; i < p.num_splits; i += blockDim.x) {
    sm_m[i] = ml[2 * i];
    sm_w[i] = ml[2 * i + 1];
  }
  __syncthreads();
  float mx = -INFINITY;
  for (int i = 0; i < p.num_splits; ++i) mx = fmaxf(mx, sm_m[i]);
  float sum = 0, o = 0;
  const float* po = p.partial_o + int64_t(sh) * p.num_splits * p.head_dim + d;
#pragma unroll 8
  for (int i = 0; i < p.num_splits; ++i) {
    const float w = sm_m[i] == -INFINITY ? 0.0f : exp2f(sm_m[i] - mx);  // empty split: 0
    sum += sm_w[i] * w;
    o += po[int64_t(i) * p.head_dim] * w;
  }
  const int row = p.meta.q_indptr[s];
  p.out[(int64_t(row) * p.heads + h) * p.head_dim + d] = float_to_bf16(o / sum * p.v_scale);
}

template <int D>
void launch_d(const AttentionParams& p, cudaStream_t stream) {
  const int group = p.heads / p.kv_heads;
  const dim3 grid(p.num_splits, p.kv_heads, p.meta.num_seqs);
  if (group <= 1) launch_pdl(decode_kernel<D, 1>, grid, dim3(kWarps * 32), 0, stream, p);
  else if (group <= 2) launch_pdl(decode_kernel<D, 2>, grid, dim3(kWarps * 32), 0, stream, p);
  else if (group <= 4) launch_pdl(decode_kernel<D, 4>, grid, dim3(kWarps * 32), 0, stream, p);
  else launch_pdl(decode_kernel<D, 8>, grid, dim3(kWarps * 32), 0, stream, p);
  CUDA_LAUNCH_CHECK();
}

}  // namespace

bool decode_attention_supported(int head_dim, int group) {
  return (head_dim == 16 || head_dim == 32 || head_dim == 64 || head_dim == 128) && group >= 1 &&
         group <= 8;
}

int decode_tokens_per_iteration(int head_dim) {
  return kWarps * (32 / (head_dim / 8)) * kUnroll;
}

void launch_decode_attention(const AttentionParams& p, cudaStream_t stream) {
  if (p.meta.num_seqs == 0) return;
  switch (p.head_dim) {
    case 16: launch_d<16>(p, stream); break;
    case 32: launch_d<32>(p, stream); break;
    case 64: launch_d<64>(p, stream); break;
    case 128: launch_d<128>(p, stream); break;
    default: CHECK_MSG(false, "decode attention: head_dim {}", p.head_dim);
  }
  if (p.num_splits > 1) {
    launch_pdl(combine_kernel, dim3(unsigned(p.meta.num_seqs * p.heads)), dim3(p.head_dim),
               size_t(p.num_splits) * 2 * sizeof(float), stream, p);
    CUDA_LAUNCH_CHECK();
  }
}

}  // namespace strata::cuda
