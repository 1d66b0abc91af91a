// The decode regime of the MoE experts: a batched GEMV over the experts the plan found rows for.
//
// Grid (row-tile slots, active experts): block (b, a) takes expert active[a] (blocks past the
// device count of active experts exit at once: the grid is sized by the host's bound
// min(E, T·k)) and 8 / KS of its 16-row weight tiles, KS warps per tile splitting k (the most
// that still fit one wave of resident blocks, as launch_int4_gemv chooses). A warp streams its
// tile's k in batches of U 512-byte tiles (one 16-byte load per lane each, two batches in flight
// in turn) and multiplies them on the tensor cores, mma.m16n8k16 with the 16 weight rows as A
// and up to NT n-tiles of 8 of the expert's rows as B (x from global/L1, 32-bit pairs). An expert
// with more rows than 8 · NT streams its weights once per pass of 8 · NT rows (a skewed batch
// costs time, never correctness). GLU (gate_up): a warp holds a gate tile and the matching up
// tile, so silu(g) · u is its epilogue. Partial sums of the KS warps meet in shared memory in a
// fixed order; nothing is accumulated atomically.
#include <algorithm>

#include "backend/cuda/moe_experts.cuh"

namespace strata::cuda {
namespace {

using namespace moe;

constexpr int kWarps = 8;
constexpr int kBlocksPerSm = 2;  // resident at <= 128 registers per thread

int num_sms() {
  static const int sms = [] {
    int dev = 0, n = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    return n;
  }();
  return sms;
}

// Tiles per batch: 16-byte loads in flight per lane per matrix (twice that with the other
// buffer), fewer where 2 and 4 n-tiles need the registers (linear_int4.cu's choice).
constexpr int gemv_unroll(int nt, bool glu) {
  return nt == 1 ? (glu ? 2 : 4) : (nt == 2 && !glu ? 2 : 1);
}

template <int NM, int U>
struct Batch {  // this lane's 16 bytes of U consecutive k tiles per matrix, and their scales
  uint4 w[NM][U];
  TileScale s[NM][U];
};

// Where a warp's tile stream starts, per matrix: lane's bytes of k tile 0, and its scales.
struct TileSrc {
  const uint4* w;
  const void* s;  // int4: this lane's scale word of group 0; fp8: the row block's scale row
};

template <int F>
__device__ __forceinline__ TileScale load_scale(const void* s, int kt, int gshift, bool group32) {
  TileScale sc{0, 0};
  if constexpr (F == kMoeInt4) {
    const uint32_t* sp = static_cast<const uint32_t*>(s);
    const int g0 = (kt * 64) >> gshift;
    sc.s0 = __ldg(sp + g0 * 8);
    sc.s1 = group32 ? __ldg(sp + (g0 + 1) * 8) : sc.s0;
  } else if constexpr (F == kMoeFp8) {
    sc.s0 = __float_as_uint(__ldg(static_cast<const float*>(s) + (kt * 32) / kMoeFp8Block));
  }
  return sc;
}

template <int F, int NM, int U>
__device__ __forceinline__ void load_batch(Batch<NM, U>& b, const TileSrc* src, int kt0,
                                           int kt_count, bool valid, int gshift, bool group32) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int kt = kt0 + u;
    const bool ok = valid && kt < kt_count;
#pragma unroll
    for (int mt = 0; mt < NM; ++mt) {
      if (ok) {
        b.w[mt][u] = __ldcs(src[mt].w + kt * 32);
        b.s[mt][u] = load_scale<F>(src[mt].s, kt, gshift, group32);
      } else {
        b.w[mt][u] = make_uint4(0, 0, 0, 0);
        b.s[mt][u] = TileScale{0, 0};
      }
    }
  }
}

// Multiplies one batch. xrow[j]: element offset in x of n-tile j's row 8j + g at column 2c, -1
// past the expert's rows (32-bit: the launcher checks x's size); k % 16 == 0, so each k16 step
// lies wholly inside or past k, and steps past k (the last tile's padding, tiles past the last
// of a partial batch) are skipped.
template <int F, int NT, int NM, int U>
__device__ __forceinline__ void mma_batch(float (&acc)[NM][NT][4], const Batch<NM, U>& cur,
                                          const bf16_bits* x, const int32_t* xrow, int nt, int kt0,
                                          int k) {
  constexpr int S = kSteps<F>;
#pragma unroll
  for (int u = 0; u < U; ++u) {
#pragma unroll
    for (int s = 0; s < S; ++s) {
      const int koff = (kt0 + u) * (16 * S) + 16 * s;
      if (koff >= k) continue;  // uniform over the warp
      uint32_t xb[NT][2];
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const bool ok = j < nt && xrow[j] >= 0;
        const unsigned int* src = reinterpret_cast<const unsigned int*>(x + xrow[j] + koff);
        xb[j][0] = ok ? __ldg(src) : 0u;
        xb[j][1] = ok ? __ldg(src + 4) : 0u;
      }
#pragma unroll
      for (int mt = 0; mt < NM; ++mt) {
        uint32_t a[4];
        fragment<F>(cur.w[mt][u], cur.s[mt][u], s, a);
#pragma unroll
        for (int j = 0; j < NT; ++j)
          if (j < nt) int4::mma16816(acc[mt][j], a, xb[j][0], xb[j][1]);
      }
    }
  }
}

template <int F, int NT, bool GLU>
__global__ void __launch_bounds__(kWarps * 32, kBlocksPerSm) moe_gemv_kernel(MoeGroupedParams p) {
  constexpr int NM = GLU ? 2 : 1;
  constexpr int U = gemv_unroll(NT, GLU);
  constexpr int TK = 16 * kSteps<F>;
  __shared__ float red[kWarps][NM * NT * 4][32];
  if (p.pdl_early) pdl_trigger();
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int g = lane / 4, c = lane % 4;
  const int ks = p.ksplit, part = warp % ks;
  const int64_t tile = int64_t(blockIdx.x) * (kWarps / ks) + warp / ks;
  const int64_t tiles = (GLU ? p.glu_inter : p.w.n) / kMoeTileRows;
  const bool valid = tile < tiles;
  pdl_wait();
  if (!p.pdl_early) pdl_trigger();

  // This block's expert and its permuted rows [r0, r1).
  int64_t e = 0, r0 = 0, r1 = p.rows;
  if (p.offsets != nullptr) {
    const int a = int(blockIdx.y);
    if (a >= p.counts[0]) return;  // the whole block
    e = p.active[a];
    r0 = p.offsets[e];
    r1 = p.offsets[e + 1];
  }
  const int k = int(p.w.k), kt_count = (k + TK - 1) / TK;
  const int gshift = __ffs(p.w.group) - 1;
  const bool group32 = p.w.group == 32;
  TileSrc src[NM];
#pragma unroll
  for (int mt = 0; mt < NM; ++mt) {
    const int64_t rt = tile + (mt ? p.glu_inter / kMoeTileRows : 0);
    src[mt].w = reinterpret_cast<const uint4*>(static_cast<const char*>(p.w.values) +
                                               e * p.w.values_stride) +
                rt * kt_count * 32 + lane;
    const char* sbase = static_cast<const char*>(p.w.scales) + e * p.w.scales_stride;
    if constexpr (F == kMoeInt4) {
      src[mt].s =
          reinterpret_cast<const uint32_t*>(sbase) + rt * int4_scale_groups(k, p.w.group) * 8 + g;
    } else if constexpr (F == kMoeFp8) {
      src[mt].s = reinterpret_cast<const float*>(sbase) +
                  (rt * kMoeTileRows / kMoeFp8Block) * ((k + kMoeFp8Block - 1) / kMoeFp8Block);
    } else {
      src[mt].s = nullptr;
    }
  }
  const int batches = (kt_count + U - 1) / U;
  const int64_t out_cols = GLU ? p.glu_inter : p.w.n;

  // Passes of up to 8 · NT rows; every warp of the block runs the same passes (same expert).
  for (int64_t c0 = r0; c0 < r1; c0 += 8 * NT) {
    const int nt = int(min(int64_t(NT), (r1 - c0 + 7) / 8));
    int32_t xrow[NT];
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      const int64_t r = c0 + 8 * j + g;
      const int64_t xr = r < r1 ? (p.row_token ? int64_t(p.row_token[r]) : r) : -1;
      xrow[j] = xr >= 0 ? int32_t(xr * k + 2 * c) : -1;
    }
    Batch<NM, U> cur, nxt;
    load_batch<F, NM, U>(cur, src, part * U, kt_count, valid, gshift, group32);
    load_batch<F, NM, U>(nxt, src, (part + ks) * U, kt_count, valid && part + ks < batches, gshift,
                         group32);
    float acc[NM][NT][4];
#pragma unroll
    for (int mt = 0; mt < NM; ++mt)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[mt][j][i] = 0.0f;
    if (valid) {
      // cur holds batch b and nxt batch b + ks on entry to each iteration.
      for (int b = part; b < batches; b += 2 * ks) {
        mma_batch<F, NT, NM, U>(acc, cur, p.x, xrow, nt, b * U, k);
        if (b + ks >= batches) break;
        load_batch<F, NM, U>(cur, src, (b + 2 * ks) * U, kt_count, b + 2 * ks < batches, gshift,
                             group32);
        mma_batch<F, NT, NM, U>(acc, nxt, p.x, xrow, nt, (b + ks) * U, k);
        load_batch<F, NM, U>(nxt, src, (b + 3 * ks) * U, kt_count, b + 3 * ks < batches, gshift,
                             group32);
      }
    }
    if (ks > 1) {  // the k-split warps' partial sums, in warp order
      if (part != 0) {
#pragma unroll
        for (int mt = 0; mt < NM; ++mt)
#pragma unroll
          for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int i = 0; i < 4; ++i) red[warp][(mt * NT + j) * 4 + i][lane] = acc[mt][j][i];
      }
      __syncthreads();
      if (part == 0) {
        for (int q = 1; q < ks; ++q)
#pragma unroll
          for (int mt = 0; mt < NM; ++mt)
#pragma unroll
            for (int j = 0; j < NT; ++j)
#pragma unroll
              for (int i = 0; i < 4; ++i)
                acc[mt][j][i] += red[warp + q][(mt * NT + j) * 4 + i][lane];
      }
    }
    if (part == 0 && valid) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t col = tile * kMoeTileRows + g + 8 * h;
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
          for (int e2 = 0; e2 < 2; ++e2) {
            const int64_t r = c0 + 8 * j + 2 * c + e2;
            if (j >= nt || r >= r1) continue;
            float v = acc[0][j][2 * h + e2];
            if constexpr (GLU) v = silu(round_bf16(v)) * round_bf16(acc[NM - 1][j][2 * h + e2]);
            p.out[r * out_cols + col] = float_to_bf16(v);
          }
      }
    }
    if (ks > 1) __syncthreads();  // red is reused by the next pass
  }
}

template <int F, int NT, bool GLU>
void launch_nt(const MoeGroupedParams& p_in, int64_t experts, cudaStream_t stream) {
  constexpr int U = gemv_unroll(NT, GLU);
  MoeGroupedParams p = p_in;
  const int64_t tiles = (GLU ? p.glu_inter : p.w.n) / kMoeTileRows;
  const int64_t batches = ceil_div(moe_k_tiles(F, p.w.k), U);
  if (p.ksplit == 0) {
    // The most warps per tile (1..8, each with a batch at least) whose grid, at the bound of
    // active experts, still fits one wave of resident blocks.
    const int64_t slots = int64_t(num_sms()) * kBlocksPerSm;
    int ks = 1;
    while (ks < kWarps && 2 * ks <= batches &&
           ceil_div(tiles, kWarps / (2 * ks)) * experts <= slots)
      ks *= 2;
    p.ksplit = ks;
  }
  const dim3 grid(unsigned(ceil_div(tiles, kWarps / p.ksplit)), unsigned(experts));
  launch_pdl(moe_gemv_kernel<F, NT, GLU>, grid, dim3(kWarps * 32), 0, Launch{stream}, p);
  CUDA_LAUNCH_CHECK();
}

template <int F, bool GLU>
void launch_format(const MoeGroupedParams& p, int64_t experts, cudaStream_t stream) {
  if (p.gemv_tokens <= 8)
    launch_nt<F, 1, GLU>(p, experts, stream);
  else if (p.gemv_tokens <= 16)
    launch_nt<F, 2, GLU>(p, experts, stream);
  else
    launch_nt<F, 4, GLU>(p, experts, stream);
}

template <bool GLU>
void launch_glu(const MoeGroupedParams& p, int64_t experts, cudaStream_t stream) {
  switch (p.w.format) {
    case kMoeBf16:
      launch_format<kMoeBf16, GLU>(p, experts, stream);
      break;
    case kMoeFp8:
      launch_format<kMoeFp8, GLU>(p, experts, stream);
      break;
    default:
      launch_format<kMoeInt4, GLU>(p, experts, stream);
      break;
  }
}

}  // namespace

void launch_moe_gemv(const MoeGroupedParams& p, cudaStream_t stream) {
  const char* why = nullptr;
  CHECK_MSG(moe_weight_shape_ok(p.w.format, p.w.n, p.w.k, p.w.group, &why), "moe gemv: {}", why);
  CHECK_MSG(p.glu_inter == 0 || (p.w.n == 2 * p.glu_inter && p.glu_inter % kMoeTileRows == 0),
            "moe gemv: SwiGLU needs n = 2 · inter, inter % 16 == 0 (n {}, inter {})", p.w.n,
            p.glu_inter);
  // fp8: a 128-row scale block must not straddle the gate and up halves.
  CHECK_MSG(p.glu_inter == 0 || p.w.format != kMoeFp8 || p.glu_inter % kMoeFp8Block == 0,
            "moe gemv: fp8 gate_up needs inter % 128 == 0 (inter {})", p.glu_inter);
  CHECK(p.ksplit == 0 || p.ksplit == 1 || p.ksplit == 2 || p.ksplit == 4 || p.ksplit == 8);
  CHECK(uintptr_t(p.x) % 16 == 0 && uintptr_t(p.w.values) % 16 == 0 && p.w.values_stride % 16 == 0);
  const int64_t experts = p.offsets ? p.max_active : 1;
  if (experts <= 0 || (p.offsets == nullptr && p.rows <= 0)) return;
  // x offsets are 32-bit in the kernel.
  CHECK_MSG(p.rows * p.w.k < (int64_t(1) << 31), "moe gemv: x of {} x {} too large", p.rows, p.w.k);
  CHECK(experts <= 65535);
  if (p.glu_inter > 0)
    launch_glu<true>(p, experts, stream);
  else
    launch_glu<false>(p, experts, stream);
}

}  // namespace strata::cuda
