// The ring GEMV: bf16 decode linears of a few rows (m <= 2) whose weights are small enough that
// a launch's start and end cost as much as its stream (linear.h GemvRingParams; linear.cu picks
// it by CudaTunables::gemv_ring_max_mb).
//
// ## Why (measured 2026-12-02, H200, ncu per decode step)
// One Kimi-K2.5 rank at batch 1 spends 2.34 ms of its 61 layers in the bf16 GEMVs (q_a, kv_a,
// q_b, o_proj, the shared expert: ~61 MB a layer, 14 us at copy bandwidth, measured ~38 us);
// Moonlight's are ~35 us a layer for ~58 MB. gemv_kernel (linear.cu) issues a warp's loads in
// batches of 4 only after its PDL wait: every launch pays the first loads' latency, twice or three
// times per warp, with nothing in flight before the wait.
//
// ## This kernel (the bf16 counterpart of linear_int4_reg.cu)
// - A fixed grid of two blocks of 8 warps per SM (fewer where there are fewer rows). Block b owns
//   whole output rows (GLU: outputs, i.e. gate/up pairs: its gate rows, then the same up rows);
//   their weights are one stream of 512-byte pieces in [row][piece] order (a piece: 256 bf16 of a
//   row, 16 bytes a lane); warp w takes the w-th contiguous eighth of the stream, cut anywhere.
// - Each lane keeps a ring of U (8) 16-byte pieces in registers, loaded U positions ahead: 32 KB a
//   block, 64 KB an SM in flight from the first load to the last. The ring is filled before
//   griddepcontrol.wait (weights are never written by a kernel) and the kernel lets its successor
//   launch at once, so the successor's ring fills while this kernel streams.
// - x (m rows) is read through L1 (__ldg) per piece, as gemv_kernel does.
// - A row's lane sums meet by shuffles when the warp leaves the row; lane 0 adds them into the
//   row's slot of the warp (shared memory). After the block's barrier each output sums its row's
//   warp slots in warp order (deterministic), adds the bias and rounds once (GLU: gate and up
//   rounded to bf16, then silu(g)·u, as gemv_kernel and launch_silu_mul round).
#include <algorithm>
#include <type_traits>

#include "backend/cuda/common.cuh"
#include "backend/cuda/linear.h"

namespace strata::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kRing = 8;        // 16-byte pieces in flight per lane
constexpr int kPiece = 256;     // bf16 a warp-wide piece covers
constexpr int kMaxRows = 2;     // m
constexpr int kSmemSlots = 64;  // rows a warp's part may span (ring_grid keeps it so)

template <int N, int I = 0, typename F>
__device__ __forceinline__ void static_for(F&& f) {
  if constexpr (I < N) {
    f(std::integral_constant<int, I>{});
    static_for<N, I + 1>(f);
  }
}

// The block's rows: [r0, r0 + nr) of the weight (GLU: outputs [r0, r0 + nr), i.e. gate rows
// r0.. then up rows glu_inter + r0..; the stream's row j < nr is gate row r0 + j, j >= nr up row
// glu_inter + r0 + j - nr).
template <int M, bool GLU>
__global__ void __launch_bounds__(kWarps * 32, 2) gemv_ring_kernel(GemvParams p, int64_t rows) {
  __shared__ float slot[kWarps][kSmemSlots][M];
  const int warp = __shfl_sync(~0u, int(threadIdx.x) / 32, 0), lane = int(threadIdx.x) % 32;
  const int64_t r0 = int64_t(blockIdx.x) * rows / gridDim.x;
  const int nr = int(int64_t(blockIdx.x + 1) * rows / gridDim.x - r0);
  const int stream_rows = GLU ? 2 * nr : nr;
  const int pieces = int((p.k + kPiece - 1) / kPiece);
  const int64_t total = int64_t(stream_rows) * pieces;
  const int a = int(int64_t(warp) * total / kWarps), b = int(int64_t(warp + 1) * total / kWarps);
  auto row_of = [&](int j) -> int64_t {  // weight row of stream row j
    if constexpr (GLU) return j < nr ? r0 + j : p.glu_inter + r0 + j - nr;
    return r0 + j;
  };
  // Loads run in stream order: (lj, lq) is the next position's stream row and piece.
  int lj = a / pieces, lq = a - lj * pieces, next = a;
  uint4 ring[kRing];
  auto load = [&](auto t_c) {
    constexpr int t = decltype(t_c)::value;
    ring[t] = make_uint4(0, 0, 0, 0);
    if (next < b) {
      const int64_t kk = int64_t(lq) * kPiece + lane * 8;
      if (kk < p.k) ring[t] = __ldcs(reinterpret_cast<const uint4*>(p.w + row_of(lj) * p.k + kk));
      if (++lq == pieces) {
        lq = 0;
        ++lj;
      }
      ++next;
    }
  };
  static_for<kRing>([&](auto t_c) { load(t_c); });
  pdl_trigger();
  pdl_wait();

  const int j_first = a / pieces;
  float acc[M];
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = 0.0f;
  int j = j_first, q = a - j_first * pieces;  // the position being multiplied: stream row, piece
  auto flush = [&]() {
#pragma unroll
    for (int m = 0; m < M; ++m) {
      float v = acc[m];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(~0u, v, o);
      if (lane == 0) slot[warp][j - j_first][m] = v;
      acc[m] = 0.0f;
    }
  };
  for (int i0 = a; i0 < b; i0 += kRing) {
    static_for<kRing>([&](auto t_c) {
      constexpr int t = decltype(t_c)::value;
      const int i = i0 + t;
      if (i < b) {
        const int64_t kk = int64_t(q) * kPiece + lane * 8;
        float wf[8];
        unpack8(ring[t], wf);
        load(t_c);
        if (kk < p.k) {
#pragma unroll
          for (int m = 0; m < M; ++m) {
            float xf[8];
            unpack8(__ldg(reinterpret_cast<const uint4*>(p.x + m * p.k + kk)), xf);
            float s = 0.0f;
#pragma unroll
            for (int e = 0; e < 8; ++e) s = fmaf(wf[e], xf[e], s);
            acc[m] += s;
          }
        }
        if (++q == pieces) {  // the row's end
          flush();
          q = 0;
          ++j;
        }
      }
    });
  }
  if (b > a && q != 0) flush();  // the part ends inside a row
  __syncthreads();

  // Outputs: a row's warp slots in warp order (warps that never touched it hold no slot).
  auto row_sum = [&](int jj, int m) {
    float s = 0.0f;
    for (int w = 0; w < kWarps; ++w) {
      const int wa = int(int64_t(w) * total / kWarps), wb = int(int64_t(w + 1) * total / kWarps);
      if (wb <= wa) continue;
      const int f = wa / pieces, l = (wb - 1) / pieces;
      if (jj >= f && jj <= l) s += slot[w][jj - f][m];
    }
    return s;
  };
  for (int e = int(threadIdx.x); e < nr * M; e += kWarps * 32) {
    const int jj = e / M, m = e % M;
    const int64_t col = r0 + jj;
    if constexpr (GLU) {
      const float bg = p.bias ? p.bias[col] : 0.0f, bu = p.bias ? p.bias[col + p.glu_inter] : 0.0f;
      const float g = bf16_to_float(float_to_bf16(row_sum(jj, m) + bg));
      const float u = bf16_to_float(float_to_bf16(row_sum(jj + nr, m) + bu));
      p.out[m * p.glu_inter + col] = float_to_bf16(g / (1.0f + __expf(-g)) * u);
    } else {
      const float bias = p.bias ? p.bias[col] : 0.0f;
      p.out[m * p.n + col] = float_to_bf16(row_sum(jj, m) + bias);
    }
  }
}

// Blocks for `rows` outputs: two per SM, fewer where a block would get no row; and enough that
// no warp's part spans more rows than it has slots (kSmemSlots).
int ring_grid(const GemvParams& p, int64_t rows) {
  const int64_t pieces = ceil_div(p.k, kPiece), stream_per_row = (p.glu_inter > 0 ? 2 : 1);
  int64_t grid = std::min<int64_t>(rows, 2 * int64_t(num_sms()));
  // A warp's part: ceil(rows_per_block · stream_per_row · pieces / 8) positions, spanning at most
  // that / pieces + 2 rows.
  auto fits = [&](int64_t g) {
    const int64_t part = ceil_div(ceil_div(rows, g) * stream_per_row * pieces, kWarps);
    return part / pieces + 2 <= kSmemSlots;
  };
  while (!fits(grid)) grid *= 2;
  return int(grid);
}

}  // namespace

bool gemv_ring_fits(const GemvParams& p) {
  return p.m >= 1 && p.m <= kMaxRows && p.k % 8 == 0 && p.k > 0 && uintptr_t(p.x) % 16 == 0 &&
         uintptr_t(p.w) % 16 == 0 && (p.glu_inter == 0 || p.n == 2 * p.glu_inter) &&
         p.n < (int64_t(1) << 31) && p.k * p.n < (int64_t(1) << 40);
}

void launch_gemv_ring(const GemvParams& p, const Launch& launch) {
  if (p.m == 0 || p.n == 0) return;
  CHECK_MSG(gemv_ring_fits(p), "ring gemv: m {} n {} k {} glu {}", p.m, p.n, p.k, p.glu_inter);
  const int64_t rows = p.glu_inter > 0 ? p.glu_inter : p.n;
  const dim3 grid(unsigned(ring_grid(p, rows))), block(kWarps * 32);
  auto go = [&](auto kernel) {
    launch_pdl(kernel, grid, block, 0, launch, p, rows);
    CUDA_LAUNCH_CHECK();
  };
  if (p.m == 1)
    p.glu_inter > 0 ? go(gemv_ring_kernel<1, true>) : go(gemv_ring_kernel<1, false>);
  else
    p.glu_inter > 0 ? go(gemv_ring_kernel<2, true>) : go(gemv_ring_kernel<2, false>);
}

}  // namespace strata::cuda
