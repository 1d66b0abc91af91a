// A W4A16 decode GEMV for m <= 8 (launch_int4_gemv runs it when gemv_kernel asks for it; the
// register GEMV of linear_int4_reg.cu is the default): weights streamed into shared memory by the
// copy engine (cp.async.bulk), one pass, on the tile layout of linear_int4.cu.
//
// ## Why not the mma GEMV of linear_int4.cu
// That kernel streams 512-byte tiles through registers (16 bytes per lane and load) and reached
// 33-44% of copy bandwidth at m = 1 (2026-12-01). Its SASS main loop issues ~122 warp
// instructions per tile (60 of dequantization, 8 x loads from L1 plus their address and
// predicate math, 4 mma, loop control): at 85% of the H200's 4.3 TB/s an SM must take a tile
// every ~37 clocks, i.e. 3.3 instructions per clock of the 4 it can issue. Its in-flight bytes
// are register-bound (two batches of U tiles per warp), so the occupancy that would hide its
// latencies also leaves no room for the next kernel's blocks to load ahead under PDL.
//
// ## This kernel
// - One block per SM (grid = SMs), W warps (8 by default). Block b owns whole row tiles
//   [b·U/G, (b+1)·U/G) of the U row tiles (SwiGLU: U gate/up pairs, the gate tiles then the up
//   tiles). Their tiles form one stream in [row tile][k tile] order -- contiguous in memory per
//   row-tile run -- and warp w streams the w-th contiguous W-th of it, cut on scale-group
//   boundaries (crossing row tiles at any group), so the warps of a block are balanced to one
//   group; the blocks to one row tile (97% for the 8B shapes: 3 vs 2.91 qkv tiles per SM).
// - Each warp has its own ring of P stages of up to CT tiles (+ their scale rows; a stage never
//   crosses a row tile's end), filled by its lane 0 with cp.async.bulk on an mbarrier per stage
//   (L2 evict-first) and refilled as soon as the warp has read a stage: W·(P-1)·CT·512 bytes in
//   flight per SM (48 KB at 8 warps, P = 4, CT = 4) at no register cost. The first P stages are
//   requested before the PDL wait (`preload`): weights are never written by the previous
//   kernel, so the stream starts while it finishes; with <= 113 KB of shared memory and ~83
//   registers per thread, the next kernel's block fits beside this one and does the same.
// - x (m <= 8 rows) is copied once per block into shared memory in B-fragment order (lane
//   (g, c) reads its 8 words of a k tile as two conflict-free 16-byte loads; lanes of tokens
//   >= m read a zero block), with its sums per scale group.
// - Per tile and lane: one 16-byte shared load of weights, two of x, 4 x (3 shifts + 4 lop3)
//   magic conversions (128 + nibble as bf16, exact), 4 mma.m16n8k16 into a group accumulator
//   grp that starts at −136·Σx; at the group's end acc += s · grp in float32 (the group's
//   place in the stage is a compile-time offset: TPG, tiles per group, is a template
//   argument). ~44 warp instructions per tile + ~50 per stage (wait, refill, row-tile end):
//   ~50 per tile at CT = 8 (PTX count; the device log has the SASS), ~1.4 per clock per SM at
//   85% of copy bandwidth, against ~120 for the mma GEMV (2026-12-01 SASS).
//   `gemv_round` = 1 instead dequantizes as the mma kernel does ((nibble − 8) · s rounded to
//   bf16, 15 instructions per word) and accumulates the mma directly: the reference's bits.
// - Partial sums per (warp, row tile) go to shared memory; after the block's barrier each
//   output sums its row tile's warps in warp order (deterministic), adds the bias and rounds
//   once (SwiGLU: gate and up rounded to bf16, then silu(g)·u, as launch_silu_mul).
//
// Numerics (gemv_round = 0): the weights are used unrounded, w = (nibble − 8) · s exactly (the
// reference rounds w to bf16 first): products exact, float32 sums; vs the rounded reference
// the difference is Σ δw·x with |δw| <= 2⁻⁹|w|, an NMSE of ~2⁻¹⁸/3 ≈ 1.3e-6 on random data --
// below the output's own bf16 rounding (~2.4e-6). The −136·Σx correction cancels a term ~30x
// the group's result (x of either sign); its float32 error stays < 1e-6 relative.
#include <algorithm>
#include <type_traits>

#include "backend/cuda/bulk_copy.cuh"
#include "backend/cuda/linear_int4.cuh"
#include "backend/cuda/linear_int4_xstage.cuh"

namespace strata::cuda {
namespace {

using namespace int4;

constexpr int kMaxWarps = 16;
constexpr int kMaxTokens = 8;          // one mma n tile
constexpr int kMaxGroup = 256;         // x sums: a group's 16-byte pieces within one warp
constexpr int kZeroBytes = 128;        // the x words lanes of tokens >= m read: both halves
constexpr int kSmemHalf = 113 * 1024;  // two blocks per SM
constexpr int kSmemMax = 227 * 1024;

// Host-computed layout of one launch (kernel argument; see plan_stream).
struct Int4StreamPlan {
  int kt;           // k tiles per row tile
  int units;        // row tiles, or gate/up pairs (SwiGLU)
  int inter_tiles;  // SwiGLU: row tiles of the gate half; 0 plain
  int stages;       // P
  int slots;        // partial-sum row tiles per warp
  int groups;       // scale groups per row (k padded to 64)
  uint32_t stage_bytes;
  uint32_t off_bar, off_x, off_zero, off_xsum, off_part, off_span, bytes;
};

// TPG: k tiles per scale group (group / 64: 1, 2 or 4), 0 for group 32 (two per tile).
template <int CT, int TPG, bool kRound>
__global__ void __launch_bounds__(kMaxWarps * 32, 1)
    int4_gemv_stream_kernel(Int4LinearParams p, Int4StreamPlan pl) {
  constexpr int kUnit = TPG == 0 ? 1 : TPG;  // tiles per part unit (a group's, or one tile)
  static_assert(kUnit <= CT && CT % kUnit == 0, "chunks hold whole groups");
  extern __shared__ __align__(128) char smem[];
  if (p.pdl_early) pdl_trigger();
  // The warp index, warp-uniform to the compiler (the copies' operands stay uniform).
  const int warp = __shfl_sync(~0u, int(threadIdx.x) / 32, 0);
  const int tid = int(threadIdx.x), lane = tid % 32, g = lane / 4, c = lane % 4;
  const int nw = int(blockDim.x) / 32, KT = pl.kt, P = pl.stages, m = int(p.m);
  const bool glu = p.glu_inter > 0;
  const int gshift = __ffs(p.group) - 1;
  const uint32_t base = smem_addr(smem);

  // The block's row tiles: slots 0..ns-1 (SwiGLU: nu gate tiles, then their nu up tiles).
  const int u0 = int(int64_t(blockIdx.x) * pl.units / gridDim.x);
  const int nu = int(int64_t(blockIdx.x + 1) * pl.units / gridDim.x) - u0;
  const int ns = glu ? 2 * nu : nu, L = ns * KT, J = glu ? nu * KT : L;
  // Global tile of stream position i: i + base0 before J, i + base1 from J (the up run).
  const int64_t base0 = int64_t(u0) * KT, base1 = int64_t(pl.inter_tiles + u0 - nu) * KT;
  // Warp w's part of the stream, [part_start(w), part_start(w + 1)), starts on a scale
  // group's first tile: a group's x sum then matches what a warp accumulates.
  auto part_start = [&](int w) { return int(int64_t(w) * (L / kUnit) / nw) * kUnit; };
  const int a = part_start(warp), b = part_start(warp + 1);
  // Its chunks: at most CT tiles, never across a row tile's end (nor J, a row tile's end):
  // each starts on a group (KT and CT are multiples of TPG) in one row tile. A cursor walks
  // them: position i, its k tile kt.
  struct Cursor {
    int i, kt;
  };
  auto chunk_len = [&](const Cursor& cu) { return min(CT, min(KT - cu.kt, b - cu.i)); };
  auto advance = [&](Cursor& cu, int len) {
    cu.i += len;
    cu.kt += len;
    if (cu.kt == KT) cu.kt = 0;
  };
  const uint32_t ring_off = uint32_t(warp * P) * pl.stage_bytes;
  const uint32_t bars = base + pl.off_bar + uint32_t(warp * P) * 8;
  const char* packed = static_cast<const char*>(p.packed);
  const char* scales = reinterpret_cast<const char*>(p.scale);
  uint64_t policy = 0;
  // The producer: lane 0 copies the chunk at cursor `pc` into stage `pst`: its tiles, then
  // their scale rows (32 bytes per row tile and group).
  Cursor pc{a, KT > 0 ? a % KT : 0};
  int pst = 0;
  auto issue_next = [&]() {
    const int len = chunk_len(pc);
    const int64_t gt0 = pc.i + (pc.i < J ? base0 : base1);
    const int64_t e0 = (gt0 * kInt4TileK) >> gshift;
    const uint32_t rows = TPG == 0 ? 2 * len : len / kUnit;
    const uint32_t wbytes = uint32_t(len) * kInt4TileBytes, sbytes = rows * 32;
    const uint32_t dst = base + ring_off + uint32_t(pst) * pl.stage_bytes;
    const uint32_t bar = bars + uint32_t(pst) * 8;
    if (lane == 0) {
      mbar_arrive_expect_tx(bar, wbytes + sbytes);
      bulk_copy_g2s_hint(dst, packed + gt0 * kInt4TileBytes, wbytes, bar, policy);
      bulk_copy_g2s_hint(dst + CT * kInt4TileBytes, scales + e0 * 32, sbytes, bar, policy);
    }
    advance(pc, len);
    if (++pst == P) pst = 0;
  };
  if (lane == 0) {
    policy = l2_evict_first_policy();
    for (int st = 0; st < P; ++st) mbar_init(bars + uint32_t(st) * 8, 1);
    mbar_init_fence();
  }
  __syncwarp();
  if (p.preload)
    for (int k = 0; k < P && pc.i < b; ++k) issue_next();
  pdl_wait();
  if (!p.pdl_early) pdl_trigger();
  if (!p.preload)
    for (int k = 0; k < P && pc.i < b; ++k) issue_next();

  // ---- x into shared memory in B-fragment order (linear_int4_xstage.cuh; halves in place: the
  // lanes of a 16-byte phase read one token, conflict-free), half 1 of a lane's words 64 bytes
  // after half 0, and the sums of x per scale group times −136, zero for tokens >= m.
  static_assert(kMaxTokens == kXsumTokens);
  {
    uint32_t* xs = reinterpret_cast<uint32_t*>(smem + pl.off_x);
    float* xsum = reinterpret_cast<float*>(smem + pl.off_xsum);
    stage_x_fragments<8, false, true>(xs, xsum, m, p.k, p.group, gshift, [&](int q, int kc) {
      return __ldg(reinterpret_cast<const uint4*>(p.x + int64_t(q / kc) * p.k) + q % kc);
    });
    // Zeros: x's padded half tile (k % 64 == 32), the zero block, sums of tokens >= m and of
    // the padded group. Disjoint from the writes above.
    if (p.k % kInt4TileK != 0)
      for (int i = tid; i < m * 16; i += int(blockDim.x))
        xs[(((KT - 1) * m + i / 16) * 2 + 1) * 16 + i % 16] = 0;
    for (int i = tid; i < kZeroBytes / 4; i += int(blockDim.x))
      reinterpret_cast<uint32_t*>(smem + pl.off_zero)[i] = 0;
    for (int i = tid; i < pl.groups * kMaxTokens; i += int(blockDim.x))
      if (i % kMaxTokens >= m || (int64_t(i / kMaxTokens) << gshift) >= p.k) xsum[i] = 0.0f;
    // Each warp's first and last row-tile slot, for the epilogue.
    if (tid < nw) {
      const int wa = part_start(tid), wb = part_start(tid + 1);
      reinterpret_cast<int2*>(smem + pl.off_span)[tid] =
          wb > wa ? make_int2(wa / KT, (wb - 1) / KT) : make_int2(1, 0);
    }
  }
  __syncthreads();

  // ---- the stream ----
  // This lane's x fragment words of k tile 0, half 0 (half 1 is 64 bytes further); lanes of
  // tokens >= m read the zero block.
  const bool xok = g < m;
  const char* x_lane = xok ? smem + pl.off_x + g * 128 + c * 16 : smem + pl.off_zero + c * 16;
  const int x_kt = xok ? m * 128 : 0;
  const char* xsum_lane = smem + pl.off_xsum + 2 * c * 4;
  float* part = reinterpret_cast<float*>(smem + pl.off_part) + warp * pl.slots * 16 * m;
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f}, grp[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  int jslot = 0, st = 0;
  uint32_t parity = 0;
  auto flush = [&]() {  // acc -> this warp's partial sums of slot jslot
    float* dst = part + jslot * 16 * m;
#pragma unroll
    for (int e = 0; e < 2; ++e)
      if (2 * c + e < m) {
        dst[g * m + 2 * c + e] = acc[e];
        dst[(g + 8) * m + 2 * c + e] = acc[2 + e];
      }
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[i] = 0.0f;
  };
  for (Cursor cc{a, KT > 0 ? a % KT : 0}; cc.i < b;) {
    const int len = chunk_len(cc);
    mbar_wait(bars + uint32_t(st) * 8, parity);
    const char* ws = smem + ring_off + st * pl.stage_bytes;
    const char* ss = ws + CT * kInt4TileBytes + g * 4;  // the chunk's first group's scales
    const char* xp = x_lane + cc.kt * x_kt;
    // The chunk's first group's −136·Σx (tokens 2c, 2c + 1).
    const char* xsp = xsum_lane + (TPG == 0 ? 2 * cc.kt : cc.kt / kUnit) * kMaxTokens * 4;
#pragma unroll
    for (int t = 0; t < CT; ++t) {
      if (t < len) {  // len: a multiple of TPG
        const uint4 q = reinterpret_cast<const uint4*>(ws + t * kInt4TileBytes)[lane];
        const uint4 xa = *reinterpret_cast<const uint4*>(xp);
        const uint4 xb = *reinterpret_cast<const uint4*>(xp + 64);
        xp += x_kt;
        const uint32_t xw[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
        const uint32_t qw[4] = {q.x, q.y, q.z, q.w};
        if constexpr (kRound) {
          const int e_t = TPG == 0 ? 2 * t : t / kUnit;  // this tile's scale row in the stage
          const uint32_t s0 = *reinterpret_cast<const uint32_t*>(ss + e_t * 32);
          const uint32_t s1w =
              TPG == 0 ? *reinterpret_cast<const uint32_t*>(ss + e_t * 32 + 32) : s0;
          uint32_t lo[2], hi[2];
          scale_pairs(s0, &lo[0], &hi[0]);
          scale_pairs(s1w, &lo[1], &hi[1]);
#pragma unroll
          for (int s = 0; s < 4; ++s) {
            uint32_t af[4];
            dequant_word(qw[s], lo[s / 2], hi[s / 2], af);
            mma16816(acc, af, xw[2 * s], xw[2 * s + 1]);
          }
        } else {
          // grp starts a scale group at −136·Σx, sums (128 + nibble)·x over it, and is added
          // to acc times the rows' scales at its end.
#pragma unroll
          for (int s = 0; s < 4; ++s) {
            uint32_t af[4];
            magic_word(qw[s], af);
            const int e = TPG == 0 ? 2 * t + s / 2 : t / kUnit;  // group in the chunk
            if (TPG == 0 ? s % 2 == 0 : s == 0 && t % kUnit == 0) {
              const float2 xs = *reinterpret_cast<const float2*>(xsp + e * kMaxTokens * 4);
              grp[0] = xs.x;
              grp[1] = xs.y;
              grp[2] = xs.x;
              grp[3] = xs.y;
            }
            mma16816(grp, af, xw[2 * s], xw[2 * s + 1]);
            if (TPG == 0 ? s % 2 == 1 : s == 3 && (t + 1) % kUnit == 0) {
              const uint32_t sw = *reinterpret_cast<const uint32_t*>(ss + e * 32);
              const float s_lo = __uint_as_float(sw << 16),
                          s_hi = __uint_as_float(sw & 0xffff0000u);
              acc[0] = fmaf(s_lo, grp[0], acc[0]);
              acc[1] = fmaf(s_lo, grp[1], acc[1]);
              acc[2] = fmaf(s_hi, grp[2], acc[2]);
              acc[3] = fmaf(s_hi, grp[3], acc[3]);
            }
          }
        }
      }
    }
    advance(cc, len);
    if (cc.kt == 0) {  // the chunk ended its row tile
      flush();
      ++jslot;
    }
    __syncwarp();
    if (pc.i < b) {
      if (lane == 0) fence_proxy_async_smem();  // this stage's reads (done: values used) first
      issue_next();                             // into the stage just read: pst == st
    }
    if (++st == P) {
      st = 0;
      parity ^= 1;
    }
  }
  if (KT > 0 && b > a && b % KT != 0) flush();  // the part ends inside a row tile
  __syncthreads();

  gemv_epilogue(p, pl, smem, tid, nw, m, glu, u0, nu, ns);
}

uint32_t align16(uint64_t v) { return uint32_t((v + 15) / 16 * 16); }

// The launch layout for `warps` warps, `stages` ring stages of `ct` tiles and `grid` blocks.
Int4StreamPlan plan_stream(const Int4LinearParams& p, int warps, int stages, int ct, int grid) {
  Int4StreamPlan pl{};
  const bool glu = p.glu_inter > 0;
  pl.kt = int(int4_k_tiles(p.k));
  pl.units = int(glu ? p.glu_inter / kInt4TileRows : int4_row_tiles(p.n));
  pl.inter_tiles = glu ? pl.units : 0;
  pl.stages = stages;
  pl.groups = int(int4_scale_groups(p.k, p.group));
  const int64_t tpg = p.group == 32 ? 1 : p.group / kInt4TileK;
  // The longest warp part (part_start in the kernel) and the row tiles it can touch.
  const int64_t tiles = (glu ? 2 : 1) * ceil_div(pl.units, grid) * pl.kt;
  const int64_t len = ceil_div(tiles / tpg, warps) * tpg;
  pl.slots = int(len == 0 ? 1 : (pl.kt + len - 2) / pl.kt + 1);
  pl.stage_bytes = uint32_t(ct * kInt4TileBytes + 2 * ct * 32);
  uint64_t off = uint64_t(warps) * stages * pl.stage_bytes;
  pl.off_bar = align16(off);
  off = pl.off_bar + uint64_t(warps) * stages * 8;
  pl.off_x = align16(off);
  off = pl.off_x + uint64_t(p.m) * pl.kt * 128;
  pl.off_zero = align16(off);
  off = pl.off_zero + kZeroBytes;
  pl.off_xsum = align16(off);
  off = pl.off_xsum + uint64_t(pl.groups) * kMaxTokens * 4;
  pl.off_part = align16(off);
  off = pl.off_part + uint64_t(warps) * pl.slots * 16 * p.m * 4;
  pl.off_span = align16(off);
  off = pl.off_span + uint64_t(warps) * 8;
  pl.bytes = off > uint64_t(kSmemMax) ? uint32_t(kSmemMax + 1) : align16(off);
  return pl;
}

struct StreamLaunch {
  int warps, ct, grid;
  bool round;
  Int4StreamPlan pl;
};

// The configuration launch_int4_gemv_stream runs for p (knobs or defaults); false where the
// kernel cannot take p: m > 8, group > 256, or more than 227 KB of shared memory (x is m·k·2
// bytes: k = 14,336 allows m <= 6).
bool choose_stream(const Int4LinearParams& p, StreamLaunch* out) {
  if (p.m < 1 || p.m > kMaxTokens || p.group > kMaxGroup || !int4_group_supported(p.group) ||
      p.k % p.group != 0)
    return false;
  StreamLaunch s;
  s.warps = p.gemv_warps > 0 ? p.gemv_warps : 8;
  s.ct = p.gemv_chunk > 0 ? p.gemv_chunk : 4;
  s.round = p.gemv_round != 0;
  const int64_t units = p.glu_inter > 0 ? p.glu_inter / kInt4TileRows : int4_row_tiles(p.n);
  s.grid = int(
      std::max<int64_t>(1, std::min<int64_t>(units, p.gemv_grid > 0 ? p.gemv_grid : num_sms())));
  // Default ring: ~64 KB per block (48 KB in flight per SM at 8 warps), fewer stages (down to 2)
  // where x would keep two blocks from fitting per SM, and down to 1 where the block would not
  // fit at all (many warps of large stages beside a large x).
  int stages = p.gemv_stages > 0 ? p.gemv_stages
                                 : std::max(2, 64 * 1024 / (s.warps * s.ct * kInt4TileBytes));
  s.pl = plan_stream(p, s.warps, stages, s.ct, s.grid);
  while (p.gemv_stages == 0 && stages > 1 &&
         (s.pl.bytes > uint32_t(kSmemMax) || (s.pl.bytes > uint32_t(kSmemHalf) && stages > 2)))
    s.pl = plan_stream(p, s.warps, --stages, s.ct, s.grid);
  if (s.pl.bytes > uint32_t(kSmemMax)) return false;
  *out = s;
  return true;
}

// Every instantiation: tiles per stage (4, 8) x tiles per group (0: group 32, 1, 2, 4) x the
// rounded-weight variant.
template <typename F>
void for_each_kernel(int ct, int tpg, bool round, F&& f) {
  auto by_tpg = [&](auto ct_c) {
    constexpr int CT = decltype(ct_c)::value;
    auto by_round = [&](auto tpg_c) {
      constexpr int TPG = decltype(tpg_c)::value;
      round ? f(int4_gemv_stream_kernel<CT, TPG, true>)
            : f(int4_gemv_stream_kernel<CT, TPG, false>);
    };
    switch (tpg) {
      case 0:
        by_round(std::integral_constant<int, 0>{});
        break;
      case 1:
        by_round(std::integral_constant<int, 1>{});
        break;
      case 2:
        by_round(std::integral_constant<int, 2>{});
        break;
      default:
        by_round(std::integral_constant<int, 4>{});
        break;
    }
  };
  if (ct == 4)
    by_tpg(std::integral_constant<int, 4>{});
  else
    by_tpg(std::integral_constant<int, 8>{});
}

}  // namespace

void init_int4_gemv_stream_kernels() {
  for (int ct : {4, 8})
    for (int tpg : {0, 1, 2, 4})
      for (bool round : {false, true})
        for_each_kernel(ct, tpg, round, [](auto kernel) {
          CUDA_CHECK(
              cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemMax));
        });
}

bool int4_gemv_stream_fits(const Int4LinearParams& p) {
  StreamLaunch s;
  return choose_stream(p, &s);
}

void launch_int4_gemv_stream(const Int4LinearParams& p, cudaStream_t stream) {
  StreamLaunch s;
  CHECK_MSG(choose_stream(p, &s),
            "int4 stream gemv: m {} k {} group {} warps {} stages {} does not fit", p.m, p.k,
            p.group, p.gemv_warps, p.gemv_stages);
  CHECK(s.warps >= 1 && s.warps <= kMaxWarps && (s.ct == 4 || s.ct == 8) && s.pl.stages >= 1);
  static PerDeviceOnce limits;  // the kernels' shared-memory limits
  limits.run(init_int4_gemv_stream_kernels);
  const dim3 grid(unsigned(s.grid)), block(unsigned(s.warps * 32));
  const int tpg = p.group == 32 ? 0 : p.group / kInt4TileK;
  for_each_kernel(s.ct, tpg, s.round, [&](auto kernel) {
    launch_pdl(kernel, grid, block, s.pl.bytes, Launch{stream}, p, s.pl);
  });
  CUDA_LAUNCH_CHECK();
}

}  // namespace strata::cuda
