// Split-KV paged prefill attention for short query chunks over long contexts (see the header).
//
// Grid (kv_heads, work items); 4 warps. A work item is one split of one query tile: 64 query rows
// = (token, query head of the group) pairs of one KV head, token-major, so every K/V row read
// serves all the group's heads (GQA); warp w owns rows [16w, 16w + 16) as one m16 mma tile whose
// Q fragments stay in registers. The block walks its split's keys in chunks of 64 gathered from
// the page table into shared memory by cp.async, kStages chunks in flight, with the slot table
// filled one chunk ahead (the decode kernel's pipeline, attention_decode.cu). S = Q·Kᵀ, the causal
// mask (row at position p sees keys <= p), the online softmax and P·V run on mma.sync m16n8k16
// with float32 accumulation; P stays in registers. fp8 K/V (e4m3, e5m2) run the mma in f16 with
// the fragments widened as they are read (exact); the K scale multiplies the scores, the V scale
// the output. A tile with one split writes `out` directly; otherwise each split writes its
// unnormalized (o, max, sum) and combine_kernel merges them.
#include <algorithm>
#include <cfloat>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/attention.h"
#include "backend/cuda/attention_mma.cuh"
#include "backend/cuda/attention_prefill_split.h"
#include "backend/cuda/attention_tile.cuh"
#include "backend/cuda/common.cuh"
#include "backend/cuda/fp8.cuh"
#include "backend/cuda/tree_mask.cuh"

namespace strata::cuda {
namespace {

using namespace attn;

constexpr int kRows = kSplitPrefillRows;  // 4 warps × 16 rows
constexpr int kThreads = 128;
constexpr int kKeys = 64;  // keys per pipeline stage
constexpr int kStages = 3;

// The K/V stages and slot table of the decode kernel's gather (attention_tile.cuh).
template <int D, int E>
struct Tile : PagedKvLayout<D, E, kKeys, kStages, kThreads> {
  static constexpr int kSmemBytes = Tile::kLoopBytes;
};

// Two floats as the mma's input pair (bf16 or f16). Not shared with the decode kernel, which
// packs bf16 with pack2 (the same values, other instructions).
template <int E>
__device__ __forceinline__ uint32_t pack_in(float lo, float hi) {
  if constexpr (E == kKvBf16) {
    return pack_bf16x2(lo, hi);
  } else {
    const __half2 h = __floats2half2_rn(lo, hi);
    uint32_t u;
    std::memcpy(&u, &h, 4);
    return u;
  }
}

template <int D, int E>
__global__ void __launch_bounds__(kThreads) split_kernel(SplitPrefillParams sp) {
  using T = Tile<D, E>;
  constexpr bool kBf16 = E == kKvBf16;
  extern __shared__ __align__(16) char smem[];
  const AttentionParams& p = sp.a;

  pdl_wait();
  pdl_trigger();
  const int kvh = blockIdx.x;
  const int32_t* item = p.tiles + 4 * blockIdx.y;
  const int s = item[0], q_start = item[1], split = item[2], part = item[3];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int gr = lane / 4, gc = (lane % 4) * 2;
  const int group = p.heads / p.kv_heads;
  const int q0 = p.meta.q_indptr[s], n_new = p.meta.q_indptr[s + 1] - q0;
  const int len = p.meta.kv_lens[s];
  const int ntok = min(kRows / group, n_new - q_start);
  const int valid_rows = ntok * group;
  const int pos_base = len - n_new + q_start;  // position of the tile's first token
  const int kv_end = min(len, pos_base + ntok);
  const int begin = split * p.split_len;
  const int end = min(kv_end, begin + p.split_len);  // > begin (the planner's splits)
  const int nchunks = (end - begin + kKeys - 1) / kKeys;

  // The split's K/V rows, gathered through the page table (attention_tile.cuh).
  const PagedKvGather<T, D> kv{smem,
                               reinterpret_cast<int32_t*>(smem + T::kSlotOff),
                               p.meta.page_indices + p.meta.page_indptr[s],
                               p.meta.page_size,
                               begin,
                               end,
                               int64_t(p.kv_heads) * D,
                               kvh,
                               static_cast<const char*>(p.k_cache),
                               static_cast<const char*>(p.v_cache),
                               tid};
  kv.start(nchunks);

  // This thread's rows: r_lo = 16w + gr and r_hi = r_lo + 8 of the tile.
  const int r_lo = warp * 16 + gr, r_hi = r_lo + 8;
  const int pos_lo = pos_base + r_lo / group, pos_hi = pos_base + r_hi / group;
  // Draft trees: the rows' ancestor words (0: causal).
  const uint64_t tw_lo =
      tree_word(p.meta.tree_mask, q0 + q_start + r_lo / group, r_lo < valid_rows);
  const uint64_t tw_hi =
      tree_word(p.meta.tree_mask, q0 + q_start + r_hi / group, r_hi < valid_rows);
  const bool warp_active = warp * 16 < valid_rows;
  const int warp_max_pos = pos_base + (min(warp * 16 + 15, valid_rows - 1)) / group;
  // Q as the A operand (zero rows past the tile).
  uint32_t qa[D / 16][4];
  {
    const bf16_bits* q_lo =
        p.q + (int64_t(q0 + q_start + r_lo / group) * p.heads + kvh * group + r_lo % group) * D;
    const bf16_bits* q_hi =
        p.q + (int64_t(q0 + q_start + r_hi / group) * p.heads + kvh * group + r_hi % group) * D;
    const bool ok_lo = r_lo < valid_rows, ok_hi = r_hi < valid_rows;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const bool hi = i & 1;
        const int col = kk * 16 + gc + (i >> 1) * 8;
        uint32_t v = (hi ? ok_hi : ok_lo)
                         ? *reinterpret_cast<const uint32_t*>((hi ? q_hi : q_lo) + col)
                         : 0u;
        if constexpr (!kBf16)
          v = pack_in<E>(__uint_as_float(v << 16), __uint_as_float(v & 0xffff0000u));
        qa[kk][i] = v;
      }
    }
  }
  const float qk_scale = p.scale_log2 * p.k_scale;
  // ldmatrix row addresses (bytes) of this lane in a 16-key slice (bf16 caches).
  const uint32_t k_lane =
      uint32_t(((lane >> 4) * 8 + (lane & 7)) * T::kStride + ((lane >> 3) & 1) * 16);
  const uint32_t v_lane =
      uint32_t((((lane >> 3) & 1) * 8 + (lane & 7)) * T::kStride + (lane >> 4) * 16);
  float o[D / 8][4];
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // rows lo, hi (l: this lane's part)

  for (int c = 0; c < nchunks; ++c) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // chunk c landed; everyone is done with chunk c - 1's buffers
    if (c + kStages - 1 < nchunks) kv.load_chunk(c + kStages - 1);
    cp_async_commit();
    // Page lookup of chunk c + kStages, stored at the end of this iteration (latency hidden).
    const int jn = begin + (c + kStages) * kKeys + tid;
    int next_slot = -1;
    if (tid < kKeys && jn < end) next_slot = kv.slot_of(jn);
    const int kv0 = begin + c * kKeys;
    if (warp_active && kv0 <= warp_max_pos) {
      const char* kb = smem + (c % kStages) * T::kStageBytes;
      const char* vb = kb + kKeys * T::kStride;
      float sc[kKeys / 8][4];
#pragma unroll
      for (int nt = 0; nt < kKeys / 8; ++nt) sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        if constexpr (kBf16) {  // two 8-key tiles' fragments per ldmatrix
#pragma unroll
          for (int np = 0; np < kKeys / 16; ++np) {
            uint32_t b[4];
            ldmatrix_x4(b, smem_addr(kb) + np * 16 * T::kStride + k_lane + kk * 32);
            mma_kv<E>(sc[2 * np], qa[kk], b[0], b[1]);
            mma_kv<E>(sc[2 * np + 1], qa[kk], b[2], b[3]);
          }
        } else {
#pragma unroll
          for (int nt = 0; nt < kKeys / 8; ++nt) {
            const char* kr = kb + (nt * 8 + gr) * T::kStride;
            mma_kv<E>(sc[nt], qa[kk], pair_at<E>(kr, kk * 16 + gc),
                      pair_at<E>(kr, kk * 16 + gc + 8));
          }
        }
      }
      // Causal mask and the split's end; online softmax of rows lo (e = 0, 1) and hi (e = 2, 3).
      float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int nt = 0; nt < kKeys / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = kv0 + nt * 8 + gc + (e & 1);
          const int pos = e < 2 ? pos_lo : pos_hi;
          sc[nt][e] =
              key < end && key <= pos && !tree_hides(e < 2 ? tw_lo : tw_hi, key, len - n_new)
                  ? sc[nt][e] * qk_scale
                  : -INFINITY;
          mx[e >> 1] = fmaxf(mx[e >> 1], sc[nt][e]);
        }
      float corr[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
        const float mn = fmaxf(m[h], mx[h]);
        const float ref = mn == -INFINITY ? 0.0f : mn;  // nothing seen yet: exp2 gives 0, not NaN
        corr[h] = exp2f(m[h] - ref);
        m[h] = mn;
        mx[h] = ref;
      }
      float rs[2] = {0.0f, 0.0f};
#pragma unroll
      for (int nt = 0; nt < kKeys / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          sc[nt][e] = exp2f(sc[nt][e] - mx[e >> 1]);
          rs[e >> 1] += sc[nt][e];
        }
      l[0] = l[0] * corr[0] + rs[0];
      l[1] = l[1] * corr[1] + rs[1];
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt) {
        o[dt][0] *= corr[0];
        o[dt][1] *= corr[0];
        o[dt][2] *= corr[1];
        o[dt][3] *= corr[1];
      }
      // O += P · V, 16 keys per k step.
#pragma unroll
      for (int kp = 0; kp < kKeys / 16; ++kp) {
        const uint32_t a[4] = {pack_in<E>(sc[2 * kp][0], sc[2 * kp][1]),
                               pack_in<E>(sc[2 * kp][2], sc[2 * kp][3]),
                               pack_in<E>(sc[2 * kp + 1][0], sc[2 * kp + 1][1]),
                               pack_in<E>(sc[2 * kp + 1][2], sc[2 * kp + 1][3])};
        if constexpr (kBf16) {  // two 8-column tiles' fragments per ldmatrix.trans
#pragma unroll
          for (int dp = 0; dp < D / 16; ++dp) {
            uint32_t b[4];
            ldmatrix_x4_trans(b, smem_addr(vb) + kp * 16 * T::kStride + v_lane + dp * 32);
            mma_kv<E>(o[2 * dp], a, b[0], b[1]);
            mma_kv<E>(o[2 * dp + 1], a, b[2], b[3]);
          }
        } else {
          const char* v0 = vb + (kp * 16 + gc) * T::kStride;
#pragma unroll
          for (int dt = 0; dt < D / 8; ++dt) {
            const int col = dt * 8 + gr;
            const uint32_t b0 = column_pair<E>(v0, v0 + T::kStride, col);
            const uint32_t b1 = column_pair<E>(v0 + 8 * T::kStride, v0 + 9 * T::kStride, col);
            mma_kv<E>(o[dt], a, b0, b1);
          }
        }
      }
    }
    // Stage c % kStages of the table was last read copying chunk c (two iterations ago) and is
    // next read copying chunk c + kStages (next iteration, after its barrier).
    if (tid < kKeys) kv.slots[(c % kStages) * kKeys + tid] = next_slot;
  }
  cp_async_wait<0>();
  if (!warp_active) return;

#pragma unroll
  for (int h = 0; h < 2; ++h) l[h] = quad_sum(l[h]);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = h ? r_hi : r_lo;
    if (r >= valid_rows) continue;
    if (part < 0) {  // the tile's only split: normalized output (the FA kernel's epilogue)
      store_out_row<D>(p, q0 + q_start, kvh, group, r, o, h, gc, p.v_scale / l[h]);
    } else {
      const int64_t at = (int64_t(part + split) * p.kv_heads + kvh) * kRows + r;
      float* dst = p.partial_o + at * D;
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt)
        *reinterpret_cast<float2*>(dst + dt * 8 + gc) = make_float2(o[dt][2 * h], o[dt][2 * h + 1]);
      if (gc == 0) {
        p.partial_ml[at * 2] = m[h];
        p.partial_ml[at * 2 + 1] = l[h];
      }
    }
  }
}

// Merges the splits of one query row: grid (combine entries, kv_heads × 64 rows), blockDim =
// head_dim. A split that saw no key of a row (the row's position is before the split) has max
// -inf and weighs 0.
__global__ void combine_kernel(SplitPrefillParams sp) {
  const AttentionParams& p = sp.a;
  pdl_wait();
  pdl_trigger();
  const int32_t* e = sp.combine + 4 * blockIdx.x;
  const int s = e[0], q_start = e[1], nsplit = e[2], first = e[3];
  const int kvh = blockIdx.y / kRows, r = blockIdx.y % kRows, d = threadIdx.x;
  const int group = p.heads / p.kv_heads;
  const int q0 = p.meta.q_indptr[s], n_new = p.meta.q_indptr[s + 1] - q0;
  if (r >= min(kRows / group, n_new - q_start) * group) return;
  const int D = p.head_dim;
  const int64_t stride = int64_t(p.kv_heads) * kRows;  // between one split's group and the next
  const int64_t at0 = (int64_t(first) * p.kv_heads + kvh) * kRows + r;
  float mx = -INFINITY;
  for (int i = 0; i < nsplit; ++i) mx = fmaxf(mx, p.partial_ml[(at0 + i * stride) * 2]);
  float sum = 0.0f, o = 0.0f;
#pragma unroll 4
  for (int i = 0; i < nsplit; ++i) {
    const int64_t at = at0 + i * stride;
    const float mi = p.partial_ml[at * 2];
    const float w = mi == -INFINITY ? 0.0f : exp2f(mi - mx);
    sum += p.partial_ml[at * 2 + 1] * w;
    o += p.partial_o[at * D + d] * w;
  }
  const int h = kvh * group + r % group;
  p.out[(int64_t(q0 + q_start + r / group) * p.heads + h) * D + d] =
      float_to_bf16(o / sum * p.v_scale);
}

template <int D, int E>
void launch_de(const SplitPrefillParams& p, const Launch& launch) {
  const dim3 grid(unsigned(p.a.kv_heads), unsigned(p.a.num_tiles));
  launch_pdl(split_kernel<D, E>, grid, dim3(kThreads), size_t(Tile<D, E>::kSmemBytes), launch, p);
  CUDA_LAUNCH_CHECK();
}

template <int D>
void launch_d(const SplitPrefillParams& p, const Launch& launch) {
  if (p.a.kv_elem == kKvE4M3)
    launch_de<D, kKvE4M3>(p, launch);
  else if (p.a.kv_elem == kKvE5M2)
    launch_de<D, kKvE5M2>(p, launch);
  else
    launch_de<D, kKvBf16>(p, launch);
}

template <int D, int E>
void set_limit() {
  CUDA_CHECK(cudaFuncSetAttribute(split_kernel<D, E>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  Tile<D, E>::kSmemBytes));
}

// Auto mode: a sequence is a candidate from this many keys (context) on, with at most
// kAutoMaxRows query rows (4x that for bf16 KV from twice the keys).
constexpr int64_t kAutoMinKeys = 2048;
constexpr int64_t kAutoMaxRows = 256;
// Splits shorter than this cost more in merging than they gain.
constexpr int64_t kMinSplitKeys = 256;

// Keys per split (a multiple of kKeys, at least kMinSplitKeys): the shortest whose grid fits in
// `target` blocks (one wave: a second, mostly empty wave would double the time), or, when even
// one split per tile overfills it, the even share of the keys over `target` blocks.
int64_t choose_split_len(const std::vector<int64_t>& ends, int kv_heads, int64_t target) {
  int64_t total = 0, longest = 0;
  for (int64_t e : ends) total += e, longest = std::max(longest, e);
  auto round_up = [](int64_t n) {
    return std::max(kMinSplitKeys, (n + kKeys - 1) / kKeys * kKeys);
  };
  auto blocks = [&](int64_t len) {
    int64_t n = 0;
    for (int64_t e : ends) n += (e + len - 1) / len;
    return n * kv_heads;
  };
  int64_t lo = round_up((total * kv_heads + target - 1) / target), hi = round_up(longest);
  if (blocks(hi) > target) return lo;
  while (lo < hi) {  // blocks() does not grow with the length
    const int64_t mid = round_up((lo + hi) / 2 / kKeys * kKeys);
    if (mid >= hi) break;
    if (blocks(mid) <= target)
      hi = mid;
    else
      lo = mid + kKeys;
  }
  return hi;
}

}  // namespace

bool split_prefill_supported(int head_dim, int group) {
  return (head_dim == 64 || head_dim == 128) && group >= 1 && group <= 16;
}

bool plan_split_prefill(const AttentionMetadata& meta, int head_dim, int group, int kv_heads,
                        bool fp8_kv, int num_sms, int mode, int blocks_per_sm,
                        SplitPrefillPlan* plan) {
  plan->seqs.clear();
  if (mode == 0 || !split_prefill_supported(head_dim, group)) return false;
  auto n_new_of = [&](int s) { return meta.q_indptr[s + 1] - meta.q_indptr[s]; };
  auto tile_end = [&](int s, int q_start, int tile_tokens) {  // keys the tile's last row sees
    const int n_new = n_new_of(s), len = meta.kv_lens[s];
    return int64_t(std::min(len, len - n_new + q_start + std::min(tile_tokens, n_new - q_start)));
  };
  std::vector<char> seqs(size_t(meta.num_seqs), mode == 2 ? 1 : 0);
  if (mode == 1) {
    // Candidates: a short chunk (or a decode row) over a long context. The split kernel
    // (mma.sync, 16 rows a warp) becomes compute-bound as the chunk grows: on the H200 it won
    // 12x / 4.9x / 1.4x over the regular kernels at 16 / 64 / 256 new tokens over 32K cached
    // (32/8 heads; 1.1x at 256 over 4K) with bf16 KV, and lost (0.97x) at 256 tokens with fp8
    // KV (bench/RESULTS.md). Rows are (token, query head of the group) pairs.
    auto candidate = [&](int s) {
      const int64_t len = meta.kv_lens[s], rows = int64_t(n_new_of(s)) * group;
      if (len < kAutoMinKeys || rows == 0) return false;
      return rows <= kAutoMaxRows ||
             (!fp8_kv && len >= 2 * kAutoMinKeys && rows <= 4 * kAutoMaxRows);
    };
    // The regular kernels run one block per (tile, KV head), each over its tile's keys: split
    // only when a candidate's longest tile would take over twice the batch's fair share of the
    // SMs' time (2 blocks per SM); a batch that fills the GPU anyway stays on them.
    const int tt = prefill_tile_tokens(head_dim, group);
    int64_t longest = 0, total = 0;
    for (int s = 0; s < meta.num_seqs; ++s) {
      seqs[size_t(s)] = candidate(s);
      for (int r = 0; r < n_new_of(s); r += tt) {
        const int64_t e = tile_end(s, r, tt);
        if (seqs[size_t(s)]) longest = std::max(longest, e);
        total += e;
      }
    }
    const double fair = double(total) * kv_heads / (2.0 * num_sms);
    if (longest == 0 || double(longest) < 2.0 * fair) return false;
  }
  const int tt = kRows / group;
  std::vector<int64_t> ends;  // keys of every tile the plan takes
  for (int s = 0; s < meta.num_seqs; ++s)
    for (int r = 0; seqs[size_t(s)] && r < n_new_of(s); r += tt) ends.push_back(tile_end(s, r, tt));
  if (ends.empty()) return false;
  const int64_t split_len = choose_split_len(ends, kv_heads, int64_t(blocks_per_sm) * num_sms);
  plan->split_len = int(split_len);
  plan->work.clear();
  plan->combine.clear();
  plan->partial_groups = 0;
  // Per sequence, split-major: the tiles reading the same keys are neighbours in the grid (L2).
  std::vector<int32_t> first;  // per tile of the sequence: first partial group, or -1
  for (int s = 0; s < meta.num_seqs; ++s) {
    if (!seqs[size_t(s)]) continue;
    const int tiles = (n_new_of(s) + tt - 1) / tt;
    first.assign(size_t(tiles), -1);
    int64_t max_splits = 0;
    for (int t = 0; t < tiles; ++t) {
      const int64_t n = (tile_end(s, t * tt, tt) + split_len - 1) / split_len;
      max_splits = std::max(max_splits, n);
      if (n > 1) {
        first[size_t(t)] = int32_t(plan->partial_groups);
        plan->combine.insert(plan->combine.end(),
                             {s, t * tt, int32_t(n), int32_t(plan->partial_groups)});
        plan->partial_groups += n;
      }
    }
    for (int64_t i = 0; i < max_splits; ++i)
      for (int t = 0; t < tiles; ++t)
        if (i * split_len < tile_end(s, t * tt, tt))
          plan->work.insert(plan->work.end(), {s, t * tt, int32_t(i), first[size_t(t)]});
  }
  if (plan->work.size() / 4 > 65535) return false;  // the grid's y extent
  plan->seqs = std::move(seqs);
  return true;
}

void init_split_prefill_kernels() {
  set_limit<64, kKvBf16>();
  set_limit<64, kKvE4M3>();
  set_limit<64, kKvE5M2>();
  set_limit<128, kKvBf16>();
  set_limit<128, kKvE4M3>();
  set_limit<128, kKvE5M2>();
}

void launch_split_prefill(const SplitPrefillParams& p, const Launch& launch) {
  if (p.a.num_tiles == 0) return;
  switch (p.a.head_dim) {
    case 64:
      launch_d<64>(p, launch);
      break;
    case 128:
      launch_d<128>(p, launch);
      break;
    default:
      CHECK_MSG(false, "split prefill attention: head_dim {}", p.a.head_dim);
  }
  if (p.num_combine > 0) {
    launch_pdl(combine_kernel, dim3(unsigned(p.num_combine), unsigned(p.a.kv_heads * kRows)),
               dim3(unsigned(p.a.head_dim)), 0, launch, p);
    CUDA_LAUNCH_CHECK();
  }
}

}  // namespace strata::cuda
