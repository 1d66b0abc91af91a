// W4A16 linears: the device layout, its repack and dequant kernels, and the decode GEMV (the
// GEMM is linear_int4_gemm.cu; shared device pieces in linear_int4.cuh).
//
// ## Design
// Checkpoint layout (compressed-tensors pack-quantized): weight_packed int32 [n, ceil(k/8)], 8
// nibbles per word along k, least significant first, value = nibble - 8; weight_scale bf16
// [n, k / group]. Streaming that row-major layout gives a warp either 512 bytes of ONE row per
// 16-byte load (a dot-product GEMV: one row's 1,024 weights per warp-load, so the CUDA cores
// would dequantize and multiply 32 weights per lane per load -- at m = 4 that is already the
// FMA pipe's whole rate) or, for the tensor cores' A fragments (rows g and g + 8 of a 16-row
// tile per lane), 64-byte pieces of 8 rows per load, which streamed the bf16 mma GEMV
// (linear_mma.cu) at only 65-75% of copy bandwidth.
//
// Device layout (launch_int4_repack, once at upload; the same bytes as the checkpoint whenever
// n % 16 == 0 and k % 64 == 0, else padded to those multiples with zero weights and scales):
//   packed: tiles of 16 rows × 64 columns, 512 bytes each, ordered [row tile][k tile]: a row
//   tile's k stream is one contiguous run. In a tile, lane l = 4g + c of a warp owns bytes
//   16l..16l+15: exactly its mma.m16n8k16 A fragments (rows g and g + 8) of the tile's four
//   k16 steps, one 32-bit word per step, the nibbles ordered so that the classic
//   `(word >> 4i) & 0x000f000f | 0x43004300` magic yields A register i as a bf16 pair
//   (linear_int4.cuh, tile_coords). Within each k16 step the columns are in their natural
//   order, so the same fragment serves mma.sync with x from registers (the GEMV) and wgmma with
//   x from shared memory (the GEMM, which cannot permute k).
//   scale: [row tile][group][16] bf16, rows ordered (0, 8, 1, 9, ..., 7, 15): lane (g, c) reads
//   its two rows' scales as one 32-bit word.
// So every weight load is one 16-byte load per lane of 512 contiguous bytes, needs no shuffle,
// no shared memory and no ldmatrix, and dequantizes in 15 instructions per 8 weights. The
// dequantized bf16 weights are bit for bit the CPU twin's (the product is rounded once to bf16).
// A grouped (MoE) variant only offsets `packed` and `scale` by an expert's stride: nothing in the
// layout depends on other experts.
//
// GEMVs (decode). launch_int4_gemv runs the register GEMV of linear_int4_reg.cu for m <= 8
// wherever its shared memory holds x (int4_gemv_reg_fits; ~120 -> ~42 instructions per tile),
// else the mma GEMV below (m <= 32); the stream GEMV of linear_int4_stream.cu only when asked.
//
// mma GEMV (m <= 32): mma.sync m16n8k16 with 16 weight rows as A and 8 tokens as B (1, 2 or
// 4 n tiles; tokens >= m multiply zeros). One warp per 16-row tile (GLU: the gate tile and its
// up tile), or KS warps of a block per tile, each streaming interleaved batches of U
// consecutive k tiles (U 16-byte loads per lane per matrix) into two register buffers in turn:
// one batch is multiplied while the next one's loads are in flight; partial sums meet in shared
// memory. x comes from global (L1) as the B fragments' 32-bit pairs. KS is the most warps per
// tile (1..8) whose grid still fits one wave of resident blocks (two of 8 warps per SM at <= 128
// registers): a partial second wave would stream with most SMs idle. With `preload`, the first
// two batches of weights and scales are loaded before pdl_wait, so the stream starts while the
// previous kernel finishes (with gemv_blocks_per_sm = 1 and pdl_early, a kernel's blocks can be
// resident beside its predecessor's and fetch all that before it ends). Cost per 512-byte tile and
// warp at m <= 8: ~60 instructions of dequant, 4 mma, ~12 for x, ~10 for loads and scales: at ~16
// bytes per clock per SM of HBM share that is ~2.7 instructions per clock per SM, so the kernel
// sits near the issue limit as well as the memory limit (the bf16 GEMV needed ~0.8).
#include <cuda_bf16.h>

#include <algorithm>

#include "backend/cuda/linear_int4.cuh"

namespace strata::cuda {
namespace {

using namespace int4;

// ---- repack: one thread per 16-byte lane piece of a tile, then one per scale ----
__global__ void int4_repack_kernel(Int4RepackParams p) {
  const int64_t kt_count = int4_k_tiles(p.k), groups = int4_scale_groups(p.k, p.group);
  const int64_t pieces = int4_row_tiles(p.n) * kt_count * 32;
  const int64_t src_groups = p.k / p.group;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < pieces; i += stride) {
    const int lane = int(i % 32);
    const int64_t tile = i / 32, rt = tile / kt_count, kt = tile % kt_count;
    uint32_t w[4];
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      uint32_t word = 0;
#pragma unroll
      for (int nib = 0; nib < 8; ++nib) {
        int row, col;
        tile_coords(lane, s, nib, &row, &col);
        const int64_t r = rt * kInt4TileRows + row, kk = kt * kInt4TileK + col;
        uint32_t v = 8;  // zero
        if (r < p.n && kk < p.k) {
          const uint32_t src = uint32_t(__ldg(p.src_packed + r * p.src_cols + kk / 8));
          v = (src >> (4 * (kk % 8))) & 0xfu;
        }
        word |= v << (4 * nib);
      }
      w[s] = word;
    }
    reinterpret_cast<uint4*>(p.dst_packed)[i] = make_uint4(w[0], w[1], w[2], w[3]);
  }
  const int64_t scales = int4_row_tiles(p.n) * groups * kInt4TileRows;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < scales; i += stride) {
    const int row = int(i % kInt4TileRows);
    const int64_t grp = (i / kInt4TileRows) % groups, rt = i / kInt4TileRows / groups;
    const int64_t r = rt * kInt4TileRows + row;
    const bf16_bits v = r < p.n && grp < src_groups ? p.src_scale[r * src_groups + grp] : 0;
    p.dst_scale[(rt * groups + grp) * kInt4TileRows + scale_slot(row)] = v;
  }
}

// ---- dequant: one thread per 8 consecutive outputs of a row (one 16-byte store) ----
__global__ void int4_dequant_kernel(Int4DequantParams p) {
  const int64_t kt_count = int4_k_tiles(p.k), groups = int4_scale_groups(p.k, p.group);
  const int64_t chunks = p.n * (p.k / 8);
  const int gshift = __ffs(p.group) - 1;
  const uint32_t* packed = static_cast<const uint32_t*>(p.packed);
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < chunks; i += stride) {
    const int64_t r = i / (p.k / 8), k0 = (i % (p.k / 8)) * 8;
    const int64_t rt = r / kInt4TileRows, kt = k0 / kInt4TileK;
    const int tr = int(r % kInt4TileRows), col = int(k0 % kInt4TileK);
    const int g = tr % 8, s = col / 16, h = (col % 16) / 8;
    const int reg = tr / 8 + 2 * h;  // A register holding (row, these columns)
    const float scale =
        bf16_to_float(p.scale[(rt * groups + (k0 >> gshift)) * kInt4TileRows + scale_slot(tr)]);
    const uint32_t* tile = packed + (rt * kt_count + kt) * (kInt4TileBytes / 4);
    uint32_t out[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) {  // columns 2c, 2c + 1 of the 8 come from lane 4g + c
      const uint32_t word = __ldg(tile + (4 * g + c) * 4 + s);
      const int lo = int((word >> (4 * reg)) & 0xfu) - 8,
                hi = int((word >> (16 + 4 * reg)) & 0xfu) - 8;
      out[c] = pack2(float(lo) * scale, float(hi) * scale);  // exact product, one rounding
    }
    *reinterpret_cast<uint4*>(p.out + r * p.k + k0) = make_uint4(out[0], out[1], out[2], out[3]);
  }
}

// ---- GEMV ----
constexpr int kGemvWarps = 8;
constexpr int kDefaultBlocksPerSm = 2;  // resident at <= 128 registers per thread
// k tiles per batch: 16-byte loads per lane per matrix in flight (twice that with the next
// batch's); fewer where the x fragments of 2 and 4 n tiles need the registers (two blocks of
// 8 warps per SM at <= 128 registers still keep 16-64 KB of weights in flight per SM).
constexpr int gemv_unroll(int nt, bool glu) {
  return nt == 1 ? (glu ? 2 : 4) : (nt == 2 && !glu ? 2 : 1);
}

template <int NM, int U>
struct Batch {  // one batch of U k tiles: this lane's packed words and scale words per matrix
  uint4 w[NM][U];
  uint32_t s[NM][U][2];  // the scales of k steps 0-1 and 2-3 (differ only for group 32)
};

template <int NM, int U>
__device__ __forceinline__ void load_batch(Batch<NM, U>& b, const uint4* const* wp,
                                           const uint32_t* const* sp, int64_t kt0, int64_t kt_count,
                                           bool valid, int gshift, bool group32) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int64_t kt = kt0 + u;
    const bool ok = valid && kt < kt_count;
#pragma unroll
    for (int mt = 0; mt < NM; ++mt) {
      if (ok) {
        b.w[mt][u] = __ldcs(wp[mt] + kt * 32);
        const int64_t g0 = (kt * kInt4TileK) >> gshift;
        b.s[mt][u][0] = __ldg(sp[mt] + g0 * 8);
        b.s[mt][u][1] = group32 ? __ldg(sp[mt] + (g0 + 1) * 8) : b.s[mt][u][0];
      } else {
        b.w[mt][u] = make_uint4(0, 0, 0, 0);
        b.s[mt][u][0] = b.s[mt][u][1] = 0;
      }
    }
  }
}

// x as B fragments of tile kt: token 8j + g, k step s -> {k 16s + 2c, +1}, {16s + 2c + 8, +9}.
// xrow[j]: token 8j + g's row at column 2c, null past m. k % 32 == 0, so each half of a tile
// (steps 0-1, 2-3) lies wholly inside or past k; past k (the last tile's padding, or tiles past
// the last in a partial batch) x is zero, never loaded.
template <int NT>
__device__ __forceinline__ void load_x(uint32_t (&xb)[NT][4][2], const bf16_bits* const* xrow,
                                       int64_t kt, int64_t k) {
  const bool lower = kt * kInt4TileK < k, upper = kt * kInt4TileK + 32 < k;
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    const unsigned int* src = reinterpret_cast<const unsigned int*>(xrow[j] + kt * kInt4TileK);
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      const bool ok = xrow[j] != nullptr && (s < 2 ? lower : upper);
      xb[j][s][0] = ok ? __ldg(src + 8 * s) : 0u;
      xb[j][s][1] = ok ? __ldg(src + 8 * s + 4) : 0u;
    }
  }
}

// Multiplies one batch: every tile's A fragments (dequantized per k step) times x. Tiles past
// the last (a partial batch) multiply zero weights by zero x: no branch, so the x loads of the
// whole batch can be issued together.
template <int NT, int NM, int U>
__device__ __forceinline__ void mma_batch(float (&acc)[NM][NT][4], const Batch<NM, U>& cur,
                                          const bf16_bits* const* xrow, int64_t kt0, int64_t k) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    uint32_t xb[NT][4][2];
    load_x<NT>(xb, xrow, kt0 + u, k);
#pragma unroll
    for (int mt = 0; mt < NM; ++mt) {
      uint32_t lo[2], hi[2];
      scale_pairs(cur.s[mt][u][0], &lo[0], &hi[0]);
      scale_pairs(cur.s[mt][u][1], &lo[1], &hi[1]);
      const uint32_t words[4] = {cur.w[mt][u].x, cur.w[mt][u].y, cur.w[mt][u].z, cur.w[mt][u].w};
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        uint32_t a[4];
        dequant_word(words[s], lo[s / 2], hi[s / 2], a);
#pragma unroll
        for (int j = 0; j < NT; ++j) mma16816(acc[mt][j], a, xb[j][s][0], xb[j][s][1]);
      }
    }
  }
}

template <int NT, int KS, bool GLU>
__global__ void __launch_bounds__(kGemvWarps * 32, 2) int4_gemv_kernel(Int4LinearParams p) {
  constexpr int NM = GLU ? 2 : 1;          // weight matrices per warp: gate and up
  constexpr int U = gemv_unroll(NT, GLU);  // k tiles per batch
  __shared__ float red[KS > 1 ? kGemvWarps : 1][NM * NT * 4][32];
  if (p.pdl_early) pdl_trigger();
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int g = lane / 4, c = lane % 4, part = warp % KS;
  const int64_t tile = int64_t(blockIdx.x) * (kGemvWarps / KS) + warp / KS;
  const int64_t tiles = GLU ? p.glu_inter / kInt4TileRows : int4_row_tiles(p.n);
  const bool valid = tile < tiles;
  const int64_t kt_count = int4_k_tiles(p.k), groups = int4_scale_groups(p.k, p.group);
  const int gshift = __ffs(p.group) - 1;
  const bool group32 = p.group == 32;
  const uint4* wp[NM];
  const uint32_t* sp[NM];
#pragma unroll
  for (int mt = 0; mt < NM; ++mt) {
    const int64_t rt = tile + (mt ? p.glu_inter / kInt4TileRows : 0);
    wp[mt] = static_cast<const uint4*>(p.packed) + rt * kt_count * 32 + lane;
    sp[mt] = reinterpret_cast<const uint32_t*>(p.scale) + rt * groups * 8 + g;
  }
  const int64_t batches = (kt_count + U - 1) / U;
  // Two batch buffers in turn: one is multiplied while the other's loads are in flight. Both
  // first batches are loaded up front (with `preload`, before the PDL wait).
  Batch<NM, U> cur, nxt;
  auto load_first = [&] {
    load_batch<NM, U>(cur, wp, sp, int64_t(part) * U, kt_count, valid, gshift, group32);
    load_batch<NM, U>(nxt, wp, sp, int64_t(part + KS) * U, kt_count, valid && part + KS < batches,
                      gshift, group32);
  };
  if (p.preload) load_first();
  pdl_wait();
  if (!p.pdl_early) pdl_trigger();
  if (!p.preload) load_first();

  float acc[NM][NT][4];
#pragma unroll
  for (int mt = 0; mt < NM; ++mt)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[mt][j][i] = 0.0f;
  if (valid) {
    const bf16_bits* xrow[NT];
#pragma unroll
    for (int j = 0; j < NT; ++j)
      xrow[j] = 8 * j + g < p.m ? p.x + (8 * j + g) * p.k + 2 * c : nullptr;
    // cur holds batch b and nxt batch b + KS on entry to each iteration.
    for (int64_t b = part; b < batches; b += 2 * KS) {
      mma_batch<NT, NM, U>(acc, cur, xrow, b * U, p.k);
      if (b + KS >= batches) break;
      load_batch<NM, U>(cur, wp, sp, (b + 2 * KS) * U, kt_count, b + 2 * KS < batches, gshift,
                        group32);
      mma_batch<NT, NM, U>(acc, nxt, xrow, (b + KS) * U, p.k);
      load_batch<NM, U>(nxt, wp, sp, (b + 3 * KS) * U, kt_count, b + 3 * KS < batches, gshift,
                        group32);
    }
  }
  if constexpr (KS > 1) {
    if (part != 0) {
#pragma unroll
      for (int mt = 0; mt < NM; ++mt)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
          for (int i = 0; i < 4; ++i) red[warp][(mt * NT + j) * 4 + i][lane] = acc[mt][j][i];
    }
    __syncthreads();
    if (part != 0) return;
#pragma unroll
    for (int q = 1; q < KS; ++q)
#pragma unroll
      for (int mt = 0; mt < NM; ++mt)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
          for (int i = 0; i < 4; ++i) acc[mt][j][i] += red[warp + q][(mt * NT + j) * 4 + i][lane];
  }
  if (!valid) return;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t row = tile * kInt4TileRows + g + 8 * h;
    if constexpr (GLU) {  // row < glu_inter: glu_inter % 16 == 0
      const float bg = p.bias ? p.bias[row] : 0.0f;
      const float bu = p.bias ? p.bias[p.glu_inter + row] : 0.0f;
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int64_t tok = 8 * j + 2 * c + e;
          if (tok >= p.m) continue;
          // The unfused path's roundings: gate and up stored in bf16, then silu_mul.
          const float gv = bf16_to_float(float_to_bf16(acc[0][j][2 * h + e] + bg));
          const float uv = bf16_to_float(float_to_bf16(acc[NM - 1][j][2 * h + e] + bu));
          p.out[tok * p.glu_inter + row] = float_to_bf16(gv / (1.0f + __expf(-gv)) * uv);
        }
    } else {
      if (row >= p.n) continue;
      const float bias = p.bias ? p.bias[row] : 0.0f;
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int64_t tok = 8 * j + 2 * c + e;
          if (tok < p.m) p.out[tok * p.n + row] = float_to_bf16(acc[0][j][2 * h + e] + bias);
        }
    }
  }
}

template <int NT, bool GLU>
void launch_gemv_nt(const Int4LinearParams& p, cudaStream_t stream) {
  constexpr int U = gemv_unroll(NT, GLU);
  const int64_t tiles = GLU ? p.glu_inter / kInt4TileRows : int4_row_tiles(p.n);
  const int64_t batches = ceil_div(int4_k_tiles(p.k), U);
  // The most warps per tile (1..8, each with a batch at least) whose grid still runs in one
  // wave of gemv_blocks_per_sm blocks per SM: a second, partial wave would stream its weights
  // with most SMs idle.
  const int64_t slots =
      int64_t(num_sms()) * (p.gemv_blocks_per_sm > 0 ? p.gemv_blocks_per_sm : kDefaultBlocksPerSm);
  int ks = 1;
  while (ks < kGemvWarps && 2 * ks <= batches && ceil_div(tiles, kGemvWarps / (2 * ks)) <= slots)
    ks *= 2;
  if (p.gemv_ksplit > 0) ks = p.gemv_ksplit;
  const dim3 grid(unsigned(ceil_div(tiles, kGemvWarps / ks))), block(kGemvWarps * 32);
  switch (ks) {
    case 1:
      launch_pdl(int4_gemv_kernel<NT, 1, GLU>, grid, block, 0, Launch{stream}, p);
      break;
    case 2:
      launch_pdl(int4_gemv_kernel<NT, 2, GLU>, grid, block, 0, Launch{stream}, p);
      break;
    case 4:
      launch_pdl(int4_gemv_kernel<NT, 4, GLU>, grid, block, 0, Launch{stream}, p);
      break;
    default:
      launch_pdl(int4_gemv_kernel<NT, 8, GLU>, grid, block, 0, Launch{stream}, p);
      break;
  }
  CUDA_LAUNCH_CHECK();
}

template <bool GLU>
void launch_gemv_glu(const Int4LinearParams& p, cudaStream_t stream) {
  if (p.m <= 8)
    launch_gemv_nt<1, GLU>(p, stream);
  else if (p.m <= 16)
    launch_gemv_nt<2, GLU>(p, stream);
  else
    launch_gemv_nt<4, GLU>(p, stream);
}

}  // namespace

void launch_int4_repack(const Int4RepackParams& p, cudaStream_t stream) {
  if (p.n == 0 || p.k == 0) return;
  CHECK_MSG(int4_group_supported(p.group) && p.k % p.group == 0,
            "int4 repack: group {} must be a power of two >= 32 dividing k = {}", p.group, p.k);
  CHECK(p.src_cols * 8 >= p.k && uintptr_t(p.dst_packed) % 16 == 0);
  const int64_t work = int4_row_tiles(p.n) * int4_k_tiles(p.k) * 32;
  const int blocks = int(std::min<int64_t>(ceil_div(work, 256), int64_t(num_sms()) * 16));
  int4_repack_kernel<<<blocks, 256, 0, stream>>>(p);
  CUDA_LAUNCH_CHECK();
}

void launch_int4_dequant_bf16(const Int4DequantParams& p, cudaStream_t stream) {
  if (p.n == 0 || p.k == 0) return;
  CHECK_MSG(int4_group_supported(p.group) && p.k % p.group == 0,
            "int4 dequant: group {} must be a power of two >= 32 dividing k = {}", p.group, p.k);
  CHECK(uintptr_t(p.out) % 16 == 0 && uintptr_t(p.packed) % 16 == 0);
  const int64_t work = p.n * (p.k / 8);
  const int blocks = int(std::min<int64_t>(ceil_div(work, 256), int64_t(num_sms()) * 16));
  int4_dequant_kernel<<<blocks, 256, 0, stream>>>(p);
  CUDA_LAUNCH_CHECK();
}

int int4_gemv_auto_kernel(const Int4LinearParams& p) {
  if (p.gemv_kernel != 0) return p.gemv_kernel;
  return int4_gemv_reg_fits(p) ? kInt4GemvReg : kInt4GemvMma;
}

void launch_int4_gemv(const Int4LinearParams& p, cudaStream_t stream) {
  if (p.m == 0 || p.n == 0) return;
  CHECK_MSG(p.m <= kInt4GemvMaxRows, "int4 gemv: {} rows (max {})", p.m, kInt4GemvMaxRows);
  CHECK_MSG(int4_group_supported(p.group) && p.k % p.group == 0,
            "int4 gemv: group {} must be a power of two >= 32 dividing k = {}", p.group, p.k);
  CHECK(uintptr_t(p.x) % 16 == 0 && uintptr_t(p.packed) % 16 == 0 && uintptr_t(p.scale) % 16 == 0);
  CHECK(p.gemv_ksplit == 0 || p.gemv_ksplit == 1 || p.gemv_ksplit == 2 || p.gemv_ksplit == 4 ||
        p.gemv_ksplit == 8);
  CHECK_MSG(p.glu_inter == 0 || (p.n == 2 * p.glu_inter && p.glu_inter % kInt4TileRows == 0),
            "int4 gemv: SwiGLU needs n = 2 · inter and inter % 16 == 0 (n {}, inter {})", p.n,
            p.glu_inter);
  const int kernel = int4_gemv_auto_kernel(p);
  CHECK_MSG(kernel == kInt4GemvReg || (p.norm.x == nullptr && p.residual == nullptr),
            "int4 gemv: a norm prologue or a residual update needs the register GEMV");
  switch (kernel) {
    case kInt4GemvReg:
      return launch_int4_gemv_reg(p, stream);
    case kInt4GemvStream:
      return launch_int4_gemv_stream(p, stream);
    default:
      CHECK_MSG(p.gemv_kernel == 0 || p.gemv_kernel == kInt4GemvMma, "int4 gemv: kernel {}",
                p.gemv_kernel);
      break;
  }
  if (p.glu_inter > 0)
    launch_gemv_glu<true>(p, stream);
  else
    launch_gemv_glu<false>(p, stream);
}

}  // namespace strata::cuda
