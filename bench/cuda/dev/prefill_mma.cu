// Paged causal prefill attention, FlashAttention-2 style on mma.sync tensor cores, for head_dim
// 64 and 128: the development variant `mma` (dev_kernels.h). The product's wgmma kernel
// (src/backend/cuda/attention_prefill_wgmma.cuh) kept its work split and tile list and ran
// faster on the H200 (bench/RESULTS.md: 313-320 TFLOP/s here at 8,192 causal tokens).
//
// A block owns 128 query rows of one KV head: the rows are (token, query head of the group)
// pairs, token-major, so the group's query heads share every K/V tile (GQA: each K/V row is read
// once per KV head and tile of tokens) and a block spans 128 / group tokens, which keeps the
// causal diagonal short. 4 warps × 32 rows (two m16 tiles, so every K/V fragment read from
// shared memory feeds two mma). K/V tiles of 64 keys are gathered through the page table into
// shared memory with cp.async, double-buffered: tile t+1 is in flight while tile t is used, and
// the page-table lookups for tile t+2 are issued one iteration earlier still (a small slot table
// in shared memory), so no warp waits on a dependent global load. Q, K and V fragments come from
// ldmatrix (V transposed by ldmatrix.trans); S = Q·Kᵀ, the online softmax (exp2, per-thread
// partial row sums) and P stay in registers. Warps skip K/V tiles wholly in their rows' future
// and mask only tiles that cross their diagonal or the context end. Blocks run longest first.
// fp8 K/V (e4m3, e5m2): the raw bytes are staged by cp.async (double-buffered) and widened to
// bf16 in shared memory before use (exact); the K scale multiplies the scores, the V scale the
// output.
#include <cfloat>

#include "backend/cuda/attention.h"
#include "backend/cuda/attention_mma.cuh"
#include "backend/cuda/attention_tile.cuh"
#include "backend/cuda/common.cuh"
#include "backend/cuda/fp8.cuh"
#include "prefill_mma.h"

namespace strata::cuda::dev {
namespace {

using namespace attn;

constexpr int kRows = kGroupedPrefillRows;  // query rows per block
constexpr int kKeys = 64;                   // keys per K/V tile
constexpr int kThreads = 128;               // 4 warps × 32 rows

template <int D, int E>
struct Layout {
  static constexpr bool kFp8 = E != kKvBf16;
  static constexpr int kLd = D + 8;  // bf16 per smem row: a 16-byte pad, conflict-free ldmatrix
  static constexpr int kQBytes = kRows * kLd * 2;
  static constexpr int kTileBytes = kKeys * kLd * 2;  // one K or V tile in bf16
  static constexpr int kStages = kFp8 ? 1 : 2;        // bf16 tiles (fp8: widened in place)
  static constexpr int kLdRaw = D + 16;               // fp8 staging bytes per row
  static constexpr int kRawTileBytes = kKeys * kLdRaw;
  static constexpr int kRawBytes = kFp8 ? 2 * 2 * kRawTileBytes : 0;
  static constexpr int kKvOff = kQBytes;
  static constexpr int kRawOff = kKvOff + kStages * 2 * kTileBytes;
  static constexpr int kSlotOff = kRawOff + kRawBytes;
  static constexpr int kBytes = kSlotOff + 2 * kKeys * 4;
  // Global -> shared: 16-byte pieces per K (or V) row; each thread copies one piece column.
  static constexpr int kPieces = D * (kFp8 ? 1 : 2) / 16;
  static constexpr int kRowStep = kThreads / kPieces;
  static constexpr int kRowsPerThread = kKeys / kRowStep;
};

// Issues the cp.async copies of K/V tile `t` (slot table stage t & 1) into its buffers.
template <int D, int E>
__device__ __forceinline__ void issue_tile(const AttentionParams& p, char* smem, int t, int kvh,
                                           int tid) {
  using L = Layout<D, E>;
  constexpr int kEb = L::kFp8 ? 1 : 2;
  const int32_t* slots = reinterpret_cast<const int32_t*>(smem + L::kSlotOff) + (t & 1) * kKeys;
  const int piece = tid % L::kPieces, r0 = tid / L::kPieces;
  const int64_t kdim_bytes = int64_t(p.kv_heads) * D * kEb;
  const int64_t col_bytes = int64_t(kvh) * D * kEb + piece * 16;
  uint32_t k_dst, v_dst;
  int ld;
  if constexpr (L::kFp8) {
    k_dst = smem_addr(smem + L::kRawOff + (t & 1) * 2 * L::kRawTileBytes);
    v_dst = k_dst + L::kRawTileBytes;
    ld = L::kLdRaw;
  } else {
    k_dst = smem_addr(smem + L::kKvOff + (t & 1) * 2 * L::kTileBytes);
    v_dst = k_dst + L::kTileBytes;
    ld = L::kLd * 2;
  }
  const char* kc = static_cast<const char*>(p.k_cache);
  const char* vc = static_cast<const char*>(p.v_cache);
#pragma unroll
  for (int i = 0; i < L::kRowsPerThread; ++i) {
    const int r = r0 + i * L::kRowStep;
    const int slot = slots[r];
    const int64_t off = slot >= 0 ? int64_t(slot) * kdim_bytes + col_bytes : 0;
    const int bytes = slot >= 0 ? 16 : 0;  // rows past the context end are zeros
    const uint32_t d = uint32_t(r * ld + piece * 16);
    cp_async16_zfill(k_dst + d, kc + off, bytes);
    cp_async16_zfill(v_dst + d, vc + off, bytes);
  }
}

// fp8 staging buffer of tile `t` -> the bf16 K/V tiles (exact: every fp8 value is a bf16).
template <int D, int E>
__device__ __forceinline__ void widen_tile(char* smem, int t, int tid) {
  using L = Layout<D, E>;
  constexpr int kGroups = kKeys * D / 8;  // 8-element groups per tile
  const char* raw = smem + L::kRawOff + (t & 1) * 2 * L::kRawTileBytes;
  char* dst = smem + L::kKvOff;
#pragma unroll 4
  for (int i = tid; i < 2 * kGroups; i += kThreads) {
    const int which = i / kGroups, g = i % kGroups;
    const int r = g / (D / 8), c = g % (D / 8);
    float f[8];
    kv_unpack8<E>(raw + which * L::kRawTileBytes + r * L::kLdRaw + c * 8, f);
    *reinterpret_cast<uint4*>(dst + which * L::kTileBytes + (r * L::kLd + c * 8) * 2) =
        make_uint4(pack_bf16x2(f[0], f[1]), pack_bf16x2(f[2], f[3]), pack_bf16x2(f[4], f[5]),
                   pack_bf16x2(f[6], f[7]));
  }
}

template <int D, int E>
__global__ void __launch_bounds__(kThreads, 2) fa_prefill_kernel(AttentionParams p) {
  using L = Layout<D, E>;
  constexpr int kDt = D / 8;  // 8-column output tiles per row
  extern __shared__ __align__(128) char smem[];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int kvh = int(blockIdx.x) % p.kv_heads;
  const int tile = p.num_tiles - 1 - int(blockIdx.x) / p.kv_heads;  // longest first
  const int group = p.heads / p.kv_heads;
  const int s = p.tiles[2 * tile], q_start = p.tiles[2 * tile + 1];
  const int q0 = p.meta.q_indptr[s], n_new = p.meta.q_indptr[s + 1] - q0;
  const int len = p.meta.kv_lens[s];
  const int ntok = min(kRows / group, n_new - q_start);
  const int valid_rows = ntok * group;
  const int pos_base = len - n_new + q_start;  // position of the tile's first token
  const int kv_end = min(len, pos_base + ntok);
  const int n_tiles = (kv_end + kKeys - 1) / kKeys;
  const int page_size = p.meta.page_size;
  const int32_t* pages = p.meta.page_indices + p.meta.page_indptr[s];
  int32_t* slots = reinterpret_cast<int32_t*>(smem + L::kSlotOff);

  for (int j = tid; j < 2 * kKeys; j += kThreads)  // tiles 0 and 1
    slots[j] = j < kv_end ? pages[j / page_size] * page_size + j % page_size : -1;
  const uint32_t q_s = smem_addr(smem);
  for (int i = tid; i < kRows * (D / 8); i += kThreads) {
    const int r = i / (D / 8), c = i % (D / 8);
    const bool ok = r < valid_rows;
    const bf16_bits* src =
        ok ? p.q + (int64_t(q0 + q_start + r / group) * p.heads + kvh * group + r % group) * D +
                 c * 8
           : p.q;
    cp_async16_zfill(q_s + (r * L::kLd + c * 8) * 2, src, ok ? 16 : 0);
  }
  __syncthreads();  // the slot table
  issue_tile<D, E>(p, smem, 0, kvh, tid);
  cp_async_commit();

  const int wr = warp * 32, g = lane / 4, c2 = (lane % 4) * 2;
  int pos[2][2];  // positions of this thread's 4 rows: [m tile][row g / g + 8]
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) pos[mt][h] = pos_base + (wr + mt * 16 + h * 8 + g) / group;
  const int warp_min_pos = pos_base + wr / group, warp_max_pos = pos_base + (wr + 31) / group;
  const bool warp_active = wr < valid_rows;  // a short tile leaves whole warps without rows
  const uint32_t q_lane = q_s + ((wr + (lane & 15)) * L::kLd + (lane >> 4) * 8) * 2;
  const uint32_t k_lane = ((((lane >> 4) * 8) + (lane & 7)) * L::kLd + ((lane >> 3) & 1) * 8) * 2;
  const uint32_t v_lane = ((((lane >> 3) & 1) * 8 + (lane & 7)) * L::kLd + (lane >> 4) * 8) * 2;
  const float qk = p.scale_log2 * p.k_scale;  // > 0 (checked at launch): max commutes with it

  float o[2][kDt][4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int dt = 0; dt < kDt; ++dt) o[mt][dt][0] = o[mt][dt][1] = o[mt][dt][2] = o[mt][dt][3] = 0;
  float m[2][2] = {{-INFINITY, -INFINITY}, {-INFINITY, -INFINITY}};
  float l[2][2] = {{0, 0}, {0, 0}};

  for (int t = 0; t < n_tiles; ++t) {
    cp_async_wait<0>();
    __syncthreads();  // tile t landed for every thread; everyone is done with tile t-1
    if (t + 1 < n_tiles) issue_tile<D, E>(p, smem, t + 1, kvh, tid);
    cp_async_commit();
    // Page lookup of tile t+2, consumed at the end of this iteration (latency hidden).
    const int jn = (t + 2) * kKeys + tid;
    int next_page = 0;
    if (tid < kKeys && jn < kv_end) next_page = pages[jn / page_size];
    uint32_t k_s = smem_addr(smem + L::kKvOff);
    if constexpr (L::kFp8) {
      widen_tile<D, E>(smem, t, tid);
      __syncthreads();
    } else {
      k_s += (t & 1) * 2 * L::kTileBytes;
    }
    const uint32_t v_s = k_s + L::kTileBytes;
    const int kv0 = t * kKeys;

    if (warp_active && kv0 <= warp_max_pos) {
      float sc[2][kKeys / 8][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < kKeys / 8; ++nt)
          sc[mt][nt][0] = sc[mt][nt][1] = sc[mt][nt][2] = sc[mt][nt][3] = 0;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t a[2][4];
        ldmatrix_x4(a[0], q_lane + kk * 32);
        ldmatrix_x4(a[1], q_lane + 16 * L::kLd * 2 + kk * 32);
#pragma unroll
        for (int np = 0; np < kKeys / 16; ++np) {
          uint32_t b[4];
          ldmatrix_x4(b, k_s + k_lane + (np * 16 * L::kLd + kk * 16) * 2);
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) {
            mma_bf16_16816(sc[mt][2 * np], a[mt], b[0], b[1]);
            mma_bf16_16816(sc[mt][2 * np + 1], a[mt], b[2], b[3]);
          }
        }
      }
      if (kv0 + kKeys - 1 > warp_min_pos || kv0 + kKeys > kv_end) {
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int nt = 0; nt < kKeys / 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int key = kv0 + nt * 8 + c2 + (e & 1);
              if (key > pos[mt][e >> 1] || key >= kv_end) sc[mt][nt][e] = -INFINITY;
            }
      }
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float mx = -INFINITY;
#pragma unroll
          for (int nt = 0; nt < kKeys / 8; ++nt)
            mx = fmaxf(mx, fmaxf(sc[mt][nt][2 * h], sc[mt][nt][2 * h + 1]));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
          const float m_new = fmaxf(m[mt][h], mx * qk);
          // A row with no visible key yet keeps -inf: 0 as its reference gives exp2 = 0, not NaN.
          const float ref = m_new == -INFINITY ? 0.0f : m_new;
          const float corr = fast_exp2(m[mt][h] - ref);
          m[mt][h] = m_new;
          float rs = 0;
#pragma unroll
          for (int nt = 0; nt < kKeys / 8; ++nt) {
            sc[mt][nt][2 * h] = fast_exp2(fmaf(sc[mt][nt][2 * h], qk, -ref));
            sc[mt][nt][2 * h + 1] = fast_exp2(fmaf(sc[mt][nt][2 * h + 1], qk, -ref));
            rs += sc[mt][nt][2 * h] + sc[mt][nt][2 * h + 1];
          }
          l[mt][h] = l[mt][h] * corr + rs;
#pragma unroll
          for (int dt = 0; dt < kDt; ++dt) {
            o[mt][dt][2 * h] *= corr;
            o[mt][dt][2 * h + 1] *= corr;
          }
        }
      }
#pragma unroll
      for (int kk = 0; kk < kKeys / 16; ++kk) {
        uint32_t a[2][4];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          a[mt][0] = pack_bf16x2(sc[mt][2 * kk][0], sc[mt][2 * kk][1]);
          a[mt][1] = pack_bf16x2(sc[mt][2 * kk][2], sc[mt][2 * kk][3]);
          a[mt][2] = pack_bf16x2(sc[mt][2 * kk + 1][0], sc[mt][2 * kk + 1][1]);
          a[mt][3] = pack_bf16x2(sc[mt][2 * kk + 1][2], sc[mt][2 * kk + 1][3]);
        }
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
          uint32_t b[4];
          ldmatrix_x4_trans(b, v_s + v_lane + (kk * 16 * L::kLd + dp * 16) * 2);
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) {
            mma_bf16_16816(o[mt][2 * dp], a[mt], b[0], b[1]);
            mma_bf16_16816(o[mt][2 * dp + 1], a[mt], b[2], b[3]);
          }
        }
      }
    }
    // Slot stage t & 1 was last read issuing tile t (before this iteration's barrier) and is
    // next read issuing tile t+2 (after the next one).
    if (tid < kKeys)
      slots[(t & 1) * kKeys + tid] = jn < kv_end ? next_page * page_size + jn % page_size : -1;
  }

#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float sum = quad_sum(l[mt][h]);
      const float inv = sum > 0 ? p.v_scale / sum : 0.0f;
      const int r = wr + mt * 16 + h * 8 + g;
      if (r >= valid_rows) continue;
      store_out_row<D>(p, q0 + q_start, kvh, group, r, o[mt], h, c2, inv);
    }
  }
}

template <int D, int E>
void launch_de(const AttentionParams& p, const Launch& launch) {
  fa_prefill_kernel<D, E>
      <<<p.num_tiles * p.kv_heads, kThreads, Layout<D, E>::kBytes, launch.stream>>>(p);
  CUDA_LAUNCH_CHECK();
}

template <int D>
void launch_d(const AttentionParams& p, const Launch& launch) {
  if (p.kv_elem == kKvE4M3)
    launch_de<D, kKvE4M3>(p, launch);
  else if (p.kv_elem == kKvE5M2)
    launch_de<D, kKvE5M2>(p, launch);
  else
    launch_de<D, kKvBf16>(p, launch);
}

template <int D, int E>
void set_limit() {
  CUDA_CHECK(cudaFuncSetAttribute(
      fa_prefill_kernel<D, E>, cudaFuncAttributeMaxDynamicSharedMemorySize, Layout<D, E>::kBytes));
}

}  // namespace

void init_mma_prefill_kernels() {
  set_limit<64, kKvBf16>();
  set_limit<64, kKvE4M3>();
  set_limit<64, kKvE5M2>();
  set_limit<128, kKvBf16>();
  set_limit<128, kKvE4M3>();
  set_limit<128, kKvE5M2>();
}

void launch_mma_prefill(const AttentionParams& p, const Launch& launch) {
  CHECK_MSG(p.scale_log2 * p.k_scale > 0, "prefill attention: scale {} · k_scale {} must be > 0",
            p.scale_log2, p.k_scale);
  switch (p.head_dim) {
    case 64:
      launch_d<64>(p, launch);
      break;
    case 128:
      launch_d<128>(p, launch);
      break;
    default:
      CHECK_MSG(false, "fa prefill attention: head_dim {}", p.head_dim);
  }
}

}  // namespace strata::cuda::dev
