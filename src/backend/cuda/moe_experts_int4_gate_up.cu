// The INT4 experts' gate_up projection by ids with each tile pair's k split over a cluster
// (moe_experts_int4_reg.h): the few-token decode steps (T · top-k <= moe_int4_reg_max_assignments),
// one row an assignment.
//
// ## Why (measured 2026-12-03, H200, one Kimi-K2.5 rank of tp 8 at batch 1, ncu)
// The register GEMV's experts mode by ids (linear_int4_reg.cu) gives each 16-row gate/up tile
// pair one CTA of 8 warps, each warp a contiguous eighth of the pair's stream (the gate row
// tile's k tiles, then the up row tile's): gate_up took 18.4 us a MoE layer for 16.5 MB (0.9
// TB/s, ~21% of copy), the largest kernel of the batch-1 step (ncu: 69% of cycles with no
// eligible warp, DRAM 18%).
//
// ## This kernel
// - Work unit: one assignment's tile pair (gate rows 16r.., up rows inter + 16r..) over all k.
//   A unit's k tiles are split over the C CTAs of a cluster (contiguous ranges), and a CTA's
//   range over its W warps: at one token (C = 1, W = 8) 128 CTAs, each warp 14 k tiles of both
//   matrices, the gate and up pieces of a k tile loaded together.
// - Each warp: a ring of R k tiles (a gate and an up 16-byte piece per lane each, with their
//   scale words), refilled as soon as a tile is multiplied; per 512-byte tile the register
//   GEMV's round mode: (nibble - 8) · scale rounded to bf16, 4 mma.m16n8k16 into two accumulators
//   (even / odd k steps), x as B fragments from shared memory (the CTA's k range of the
//   assignment's token row, staged once in the register GEMV's fragment order, m = 1). Or, group
//   32 with p.unrounded (CudaTunables::moe_int4_split_round 0, or -1 — the default — where the
//   weights come by TMA; H100, 2026-12-06: -2% at one token, +3% at two on the ring): (128 +
//   nibble) into the mma, each half tile's sums starting at −136·Σx (made once a CTA from the
//   staged x) and scaled into acc / acc1 (mma_tile_unrounded_g32).
// - Partial sums: each warp's 16 gate and 16 up rows into shared memory; the CTA sums its warps
//   in warp order, then rank 0 of the cluster sums the CTAs' sums in rank order through
//   distributed shared memory (between two cluster barriers), rounds gate and up to bf16 (an
//   unfused linear's outputs) and stores silu(gate) · up. Deterministic: the same bits every run.
// - PDL: the expert is known only after the wait (route writes the ids just before), and the
//   trigger follows the wait, so that down may read the ids before its own wait (as the register
//   GEMV's kInt4TriggerAfterWait).
// - TMA (p.tma): instead of the register ring, each warp's k tiles (gate, up and their scale
//   words: a few contiguous spans a batch) come by bulk copies of the TMA engine into a ring of
//   shared-memory slots with an mbarrier each, refilled by lane 0 as the warp finishes a slot.
//   Where the grid is one wave (a Kimi-K2.5 rank at one token: 128 CTAs) the ring is the warp's
//   whole stream in two batches, all issued as soon as the expert is known (~130 KB a CTA in
//   flight; the register ring holds 4 k tiles a warp, ~35 KB an SM). Why: at one token the split
//   gate_up read ~16.5 MB in 11-14 us, ~1.2-1.5 TB/s, about what 35 KB an SM in flight over a
//   DRAM round trip gives (Little's law). Forced (p.tma 1) on larger grids: two CTAs an SM with
//   batches of 4 k tiles, as many slots as ~108 KB allow; measured slower there (the launcher).
#include <algorithm>

#include "backend/cuda/bulk_copy.cuh"
#include "backend/cuda/cluster.cuh"
#include "backend/cuda/linear_int4.cuh"
#include "backend/cuda/moe_experts_int4_reg.h"

namespace strata::cuda {
namespace {

using namespace int4;

constexpr int kMaxWarps = 8;
constexpr int kMaxCluster = 8;  // the portable cluster size
// The launcher's shape: CTAs of 8 warps, a unit's k split over a cluster only while the grid stays
// within one CTA an SM. Measured (moe_bench --what backend, one Kimi-K2.5 rank, H200,
// 2026-12-03), the experts at T = 1 / 2: one CTA of 8 warps a unit 16.0 / 23.1 us; clusters of 2
// CTAs of 8 warps 16.1 / 26.8; of 4 CTAs of 4 warps 19.9 / 24.0 (17.0 / 24.5 with 2 k tiles in
// flight); of 8 CTAs of 4 warps 22.3 / 36.2; the register GEMV 22.7 / 29.4. More, shorter warp
// streams lose: each CTA pays its x copy, barrier and epilogue, and more loads in flight did not
// read faster.
constexpr int kDefaultWarps = 8;
constexpr int kXBatch = 4;  // x pieces a thread loads before the expert's id returns
constexpr int kMaxXBytes = 48 * 1024;
constexpr int kTileBytes = 512;              // a 16 x 64 tile of nibbles
constexpr int kTmaSmemMax = 220 * 1024;      // the TMA kernel's dynamic shared memory, at most
constexpr int kTmaSmemTwoCtas = 108 * 1024;  // ... with two CTAs an SM
constexpr int kScaleSetBytes = 8 * 4;        // group >= 64: a tile row's 8 scale words a group

// The x bytes of a CTA (its k tiles in the fragment order, 128 bytes a k tile).
__host__ __device__ inline int x_bytes(int kt, int cluster) {
  return (kt + cluster - 1) / cluster * 128;
}
// The TMA kernel's shared memory after x: the mbarriers (warp w's `stages` of them from
// bars + 8 · stages · w), then each warp's ring of `stages` slots, a slot one batch of up to
// `tiles` k tiles: its gate tiles, up tiles, gate scale words, up scale words.
constexpr int kTmaMaxStages = 16;
struct TmaLayout {
  int tiles;        // k tiles a batch
  int stages;       // slots a warp
  int scale_bytes;  // the most scale bytes of a batch, one matrix
  int slot_bytes;
  int bars;   // offset of the mbarriers
  int slots;  // offset of warp 0's first slot
  int total;  // dynamic shared memory
  __host__ __device__ TmaLayout(int kt, int cluster, int warps, int group, int tiles_, int stages_)
      : tiles(tiles_), stages(stages_) {
    // Group 32: 16 words a tile. Else one 8-word set a group of group / 64 tiles, a batch
    // possibly starting and ending inside one.
    scale_bytes = group == 32 ? tiles * 64 : (tiles * kInt4TileK / group + 2) * kScaleSetBytes;
    slot_bytes = 2 * tiles * kTileBytes + 2 * scale_bytes;
    bars = x_bytes(kt, cluster);
    slots = bars + warps * stages * 8;
    slots = (slots + 127) / 128 * 128;
    total = slots + warps * stages * slot_bytes;
  }
};
// The most k tiles a warp streams (the CTA's k range split over its warps).
__host__ __device__ inline int warp_tiles(int kt, int cluster, int warps) {
  return ((kt + cluster - 1) / cluster + warps - 1) / warps;
}

// R: k tiles in flight per warp (the register ring). G32: group 32 (two scale words a tile), else
// one word a tile (the tile's group: group >= 64). TMA: the weights by bulk copies (no ring).
// kRound: weights rounded to bf16 before the mma; else (group 32 only) mma_tile_unrounded_g32,
// with x's half-tile sums made once a CTA after its x is staged.
template <int R, bool G32, bool TMA, bool kRound>
__global__ void __launch_bounds__(kMaxWarps * 32, 2)
    int4_split_gate_up_kernel(Int4SplitGateUpParams p) {
  static_assert(kRound || G32, "unrounded tiles are group 32's");
  // Unrounded: −136·Σx of each half (32 inputs) of the CTA's k tiles.
  __shared__ float2 xsum[kRound ? 1 : kMaxXBytes / 128];
  __shared__ float red[kMaxWarps][32];  // a warp's sums: gate rows 0..15, then up rows 0..15
  __shared__ float cta_sum[32];
  extern __shared__ __align__(128) char xs_raw[];  // x of the CTA's k tiles, fragment order
  const int tid = int(threadIdx.x), lane = tid % 32, g = lane / 4, c = lane % 4;
  const int warp = __shfl_sync(~0u, tid / 32, 0), nw = int(blockDim.x) / 32;
  const int C = p.cluster, rank = int(blockIdx.x) % C;
  const int64_t unit = int64_t(blockIdx.x) / C;
  const int inter_tiles = int(p.inter / kInt4TileRows), KT = int(p.k / kInt4TileK);
  const int a = int(unit / inter_tiles), r = int(unit % inter_tiles);
  // The CTA's k tiles [kb0, kb1), the warp's [k0, k1).
  const int kb0 = rank * KT / C, kb1 = (rank + 1) * KT / C, nk = kb1 - kb0;
  const int k0 = kb0 + warp * nk / nw, k1 = kb0 + (warp + 1) * nk / nw;

  pdl_wait();
  pdl_trigger();
  // x's pieces of the CTA's range (16 bytes each), issued before the id's round trip.
  const uint4* xsrc = reinterpret_cast<const uint4*>(p.x + int64_t(a / p.x_div) * p.k) + kb0 * 8;
  const int pieces = nk * 8, nt = int(blockDim.x);
  uint4 xv[kXBatch];
#pragma unroll
  for (int u = 0; u < kXBatch; ++u) {
    const int q = tid + u * nt;
    xv[u] = q < pieces ? __ldg(xsrc + q) : make_uint4(0, 0, 0, 0);
  }
  const int e = __ldcg(p.ids + a);
  // The whole cluster shares the assignment: no cluster barrier is pending.
  if (e < 0 || e >= p.num_experts) return;

  // ---- the weights: k tile kt of the gate and up tiles into ring slot t ----
  const int64_t gbase = int64_t(e) * p.expert_tiles + int64_t(r) * KT;
  const int64_t ubase = gbase + int64_t(inter_tiles) * KT;
  const uint4* wsrc = static_cast<const uint4*>(p.packed) + lane;
  const uint32_t* ssrc = reinterpret_cast<const uint32_t*>(p.scale) + g;
  const int gshift = __ffs(p.group) - 1;
  // TMA: the warp's k tiles in batches of p.tma_tiles through a ring of p.tma_stages slots, the
  // first `stages` batches issued by lane 0 before x is staged (the copies run meanwhile).
  const TmaLayout tl(KT, C, nw, p.group, p.tma_tiles, p.tma_stages);
  const int nbatch = TMA ? (k1 - k0 + tl.tiles - 1) / tl.tiles : 0;
  char* const slot0 = xs_raw + tl.slots + warp * tl.stages * tl.slot_bytes;
  const uint32_t bar0 = smem_addr(xs_raw + tl.bars) + uint32_t(warp * tl.stages) * 8;
  // The scale set of a tile (group >= 64).
  auto set_of = [&](int64_t tile) { return (tile * kInt4TileK) >> gshift; };
  const char* packed = static_cast<const char*>(p.packed);
  const char* scales = reinterpret_cast<const char*>(p.scale);
  auto issue = [&](int j) {  // lane 0: batch j into slot j % stages
    const int ks = k0 + j * tl.tiles, ke = min(k1, ks + tl.tiles), n = ke - ks;
    const int st = j % tl.stages;
    const uint32_t bar = bar0 + 8 * st, dst = smem_addr(slot0 + st * tl.slot_bytes);
    auto scale_span = [&](int64_t base, int64_t* off) {  // bytes, and their offset
      if constexpr (G32) {
        *off = (base + ks) * 64;
        return int64_t(n) * 64;
      }
      const int64_t s0 = set_of(base + ks), s1 = set_of(base + ke - 1);
      *off = s0 * kScaleSetBytes;
      return (s1 - s0 + 1) * kScaleSetBytes;
    };
    int64_t goff = 0, uoff = 0;
    const int64_t gsb = scale_span(gbase, &goff), usb = scale_span(ubase, &uoff);
    const uint32_t wb = uint32_t(n) * kTileBytes;
    mbar_arrive_expect_tx(bar, 2 * wb + uint32_t(gsb + usb));
    const uint32_t sc = dst + 2 * tl.tiles * kTileBytes;
    bulk_copy_g2s(dst, packed + (gbase + ks) * kTileBytes, wb, bar);
    bulk_copy_g2s(dst + tl.tiles * kTileBytes, packed + (ubase + ks) * kTileBytes, wb, bar);
    bulk_copy_g2s(sc, scales + goff, uint32_t(gsb), bar);
    bulk_copy_g2s(sc + tl.scale_bytes, scales + uoff, uint32_t(usb), bar);
  };
  if constexpr (TMA) {
    if (lane == 0) {
      for (int st = 0; st < tl.stages; ++st) mbar_init(bar0 + 8 * st, 1);
      mbar_init_fence();
      for (int j = 0; j < min(nbatch, tl.stages); ++j) issue(j);
    }
    __syncwarp();
  }
  uint4 rg[R], ru[R];
  uint32_t sg[2 * R], su[2 * R];
  auto scale_at = [&](int64_t tile, int half) {  // the scale word of a tile's k half
    if constexpr (G32) return __ldg(ssrc + tile * 16 + half * 8);
    return __ldg(ssrc + ((tile * kInt4TileK) >> gshift) * 8);
  };
  auto load = [&](auto t_c, int kt) {
    constexpr int t = decltype(t_c)::value;
    if (!TMA && kt < k1) {
      rg[t] = __ldcs(wsrc + (gbase + kt) * 32);
      ru[t] = __ldcs(wsrc + (ubase + kt) * 32);
      sg[2 * t] = scale_at(gbase + kt, 0);
      su[2 * t] = scale_at(ubase + kt, 0);
      if constexpr (G32) {
        sg[2 * t + 1] = scale_at(gbase + kt, 1);
        su[2 * t + 1] = scale_at(ubase + kt, 1);
      }
    }
  };
  if constexpr (!TMA) static_for<R>([&](auto t_c) { load(t_c, k0 + decltype(t_c)::value); });

  // ---- x into shared memory: the register GEMV's B-fragment order for one token (word (kt,
  // half h, lane c, jj) at kt·32 + 16h + 4c + jj holds k 64kt + 16s + 2c + 8bb and + 1, with
  // s = 2h + jj / 2, bb = jj % 2) ----
  uint32_t* xs = reinterpret_cast<uint32_t*>(xs_raw);
  auto store_x = [&](int q, const uint4& v) {
    const int k0e = q * 8, kt = k0e / kInt4TileK, col = k0e % kInt4TileK;
    const int s = col / 16, bb = (col % 16) / 8;
    uint32_t* dst = xs + kt * 32 + (s / 2) * 16 + 2 * (s % 2) + bb;
    dst[0] = v.x;
    dst[4] = v.y;
    dst[8] = v.z;
    dst[12] = v.w;
  };
#pragma unroll
  for (int u = 0; u < kXBatch; ++u)
    if (tid + u * nt < pieces) store_x(tid + u * nt, xv[u]);
  for (int q = tid + kXBatch * nt; q < pieces; q += nt) store_x(q, __ldg(xsrc + q));
  __syncthreads();
  if constexpr (!kRound) {  // half h of tile i: words 32 i + 16 h .. + 15 in fragment order
    for (int i = tid; i < nk; i += nt) {
      float v[2] = {0.0f, 0.0f};
#pragma unroll
      for (int w = 0; w < 32; ++w)
        v[w / 16] +=
            __uint_as_float(xs[32 * i + w] << 16) + __uint_as_float(xs[32 * i + w] & 0xffff0000u);
      xsum[i] = make_float2(-136.0f * v[0], -136.0f * v[1]);
    }
    __syncthreads();
  }
  // One tile's gate or up piece into its accumulators (kt: the tile's k index).
  auto tile = [&](const uint4& q, uint32_t s0, uint32_t s1, const uint32_t* xw, int kt, float* acc,
                  float* acc1) {
    if constexpr (kRound)
      mma_tile_round(q, s0, s1, xw, acc, acc1);
    else
      mma_tile_unrounded_g32(q, s0, s1, xsum[kt - kb0], xw, acc, acc1);
  };

  // ---- the stream ----
  float ag[4] = {0, 0, 0, 0}, ag1[4] = {0, 0, 0, 0}, au[4] = {0, 0, 0, 0}, au1[4] = {0, 0, 0, 0};
  const uint32_t x_lane = smem_addr(xs_raw) + c * 16;
  if constexpr (TMA) {
    for (int j = 0; j < nbatch; ++j) {
      const int ks = k0 + j * tl.tiles, ke = min(k1, ks + tl.tiles), st = j % tl.stages;
      mbar_wait(bar0 + 8 * st, uint32_t(j / tl.stages) & 1);
      const uint32_t slot = smem_addr(slot0 + st * tl.slot_bytes);
      const uint32_t wg = slot + uint32_t(lane) * 16, wu = wg + uint32_t(tl.tiles) * kTileBytes;
      const uint32_t sg0 = slot + uint32_t(2 * tl.tiles * kTileBytes) + uint32_t(g) * 4;
      const uint32_t su0 = sg0 + uint32_t(tl.scale_bytes);
      for (int kt = ks; kt < ke; ++kt) {
        const uint32_t xp = x_lane + uint32_t(kt - kb0) * 128;
        const uint4 xa = lds128(xp), xb = lds128(xp + 64);
        const uint32_t xw[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
        const uint32_t i = uint32_t(kt - ks);
        uint32_t g0, g1, u0, u1;
        if constexpr (G32) {  // words 16 i + g and 16 i + 8 + g of the batch's span
          g0 = lds32(sg0 + 64 * i), g1 = lds32(sg0 + 64 * i + 32);
          u0 = lds32(su0 + 64 * i), u1 = lds32(su0 + 64 * i + 32);
        } else {  // word g of the tile's set, counted from the batch's first set
          g0 = g1 = lds32(sg0 + uint32_t(set_of(gbase + kt) - set_of(gbase + ks)) * kScaleSetBytes);
          u0 = u1 = lds32(su0 + uint32_t(set_of(ubase + kt) - set_of(ubase + ks)) * kScaleSetBytes);
        }
        tile(lds128(wg + i * kTileBytes), g0, g1, xw, kt, ag, ag1);
        tile(lds128(wu + i * kTileBytes), u0, u1, xw, kt, au, au1);
      }
      // The slot is read (every lane, ordered before lane 0 by the warp barrier, then before the
      // bulk copy's writes by the proxy fence): refill it with batch j + stages.
      __syncwarp();
      if (lane == 0 && j + tl.stages < nbatch) {
        fence_proxy_async_smem();
        issue(j + tl.stages);
      }
    }
  }
  for (int kt0 = k0; !TMA && kt0 < k1; kt0 += R)
    static_for<R>([&](auto t_c) {
      constexpr int t = decltype(t_c)::value;
      const int kt = kt0 + t;
      if (kt < k1) {
        const uint32_t xp = x_lane + uint32_t(kt - kb0) * 128;
        const uint4 xa = lds128(xp), xb = lds128(xp + 64);
        const uint32_t xw[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
        tile(rg[t], sg[2 * t], sg[G32 ? 2 * t + 1 : 2 * t], xw, kt, ag, ag1);
        tile(ru[t], su[2 * t], su[G32 ? 2 * t + 1 : 2 * t], xw, kt, au, au1);
        load(t_c, kt + R);
      }
    });

  // ---- sums: column 0 (the one token) of rows g and g + 8 sits in lanes c == 0 ----
  if (c == 0) {
    red[warp][g] = ag[0] + ag1[0];
    red[warp][g + 8] = ag[2] + ag1[2];
    red[warp][16 + g] = au[0] + au1[0];
    red[warp][24 + g] = au[2] + au1[2];
  }
  __syncthreads();
  if (tid < 32) {
    float v = 0.0f;
    for (int w = 0; w < nw; ++w) v += red[w][tid];
    cta_sum[tid] = v;
  }
  auto store = [&](int i, float gate, float up) {  // the unfused linear's roundings
    const float gv = bf16_to_float(float_to_bf16(gate)), uv = bf16_to_float(float_to_bf16(up));
    p.out[int64_t(a) * p.inter + int64_t(r) * kInt4TileRows + i] =
        float_to_bf16(gv / (1.0f + __expf(-gv)) * uv);
  };
  if (C == 1) {
    __syncthreads();
    if (tid < kInt4TileRows) store(tid, cta_sum[tid], cta_sum[16 + tid]);
    return;
  }
  cluster_sync();  // every CTA's sums are written
  if (rank == 0 && tid < kInt4TileRows) {
    const uint32_t gs = smem_addr(&cta_sum[tid]), us = smem_addr(&cta_sum[16 + tid]);
    float gate = 0.0f, up = 0.0f;
    for (int q = 0; q < C; ++q) {
      gate += ld_cluster(cluster_map(gs, uint32_t(q)));
      up += ld_cluster(cluster_map(us, uint32_t(q)));
    }
    store(tid, gate, up);
  }
  cluster_sync();  // rank 0 is done reading: the others' shared memory may go
}

// unrounded: group 32's unrounded instances (other groups always round).
template <typename F>
void with_kernel(int ring, int group, bool tma, bool unrounded, F&& f) {
  auto g32 = [&](auto r_c, auto tma_c) {
    constexpr int R = decltype(r_c)::value;
    constexpr bool T = decltype(tma_c)::value;
    unrounded ? f(int4_split_gate_up_kernel<R, true, T, false>)
              : f(int4_split_gate_up_kernel<R, true, T, true>);
  };
  using Ring2 = std::integral_constant<int, 2>;
  using Ring4 = std::integral_constant<int, 4>;
  if (tma)
    group == 32 ? g32(Ring2{}, std::true_type{})
                : f(int4_split_gate_up_kernel<2, false, true, true>);
  else if (ring == 2)
    group == 32 ? g32(Ring2{}, std::false_type{})
                : f(int4_split_gate_up_kernel<2, false, false, true>);
  else
    group == 32 ? g32(Ring4{}, std::false_type{})
                : f(int4_split_gate_up_kernel<4, false, false, true>);
}

void init_tma_kernels() {
  for (int group : {32, 128})
    for (bool unrounded : {false, true})
      with_kernel(2, group, true, unrounded, [](auto kernel) {
        CUDA_CHECK(
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kTmaSmemMax));
      });
}

}  // namespace

bool int4_split_gate_up_shape(Int4SplitGateUpParams* p) {
  const int64_t kt = p->k / kInt4TileK;
  if (p->k <= 0 || p->k % kInt4TileK != 0 || p->inter <= 0 || p->inter % kInt4TileRows != 0 ||
      !(p->group == 32 || p->group == 64 || p->group == 128 || p->group == 256) ||
      p->k % p->group != 0 || p->assignments < 1 || p->x_div < 1 || p->num_experts < 1)
    return false;
  if (p->warps == 0) p->warps = kDefaultWarps;
  if (p->ring == 0) p->ring = 4;
  const int64_t units = int64_t(p->assignments) * (p->inter / kInt4TileRows);
  if (p->cluster == 0) {  // CTAs a unit while they stay within one CTA an SM
    p->cluster = kMaxCluster;
    while (p->cluster > 1 &&
           (units * p->cluster > num_sms() || kt < 2 * int64_t(p->cluster) * p->warps))
      p->cluster /= 2;
  }
  if (p->warps < 1 || p->warps > kMaxWarps || (p->ring != 2 && p->ring != 4) ||
      !(p->cluster == 1 || p->cluster == 2 || p->cluster == 4 || p->cluster == kMaxCluster) ||
      p->cluster > kt || units * p->cluster > (int64_t(1) << 31) - 1 ||
      x_bytes(int(kt), p->cluster) > kMaxXBytes || p->tma < -1 || p->tma > 1 || p->unrounded < -1 ||
      p->unrounded > 1)
    return false;
  // TMA: batches and stages within the shared memory the grid's residency leaves (one wave of
  // one CTA an SM: the warp's whole stream in two batches where it fits; else two CTAs an SM, the
  // deepest ring of batches of up to 4 tiles); -1: only where the grid is one wave (the ring at
  // two to eight tokens of a Kimi-K2.5 rank lost to the register ring: 24.6 / 41.6 / 74.1 us
  // against 22.8 / 40.1 / 73.3, its batch-2 step 5.635 against 5.489 ms; H200, 2026-12-03).
  const int wt = warp_tiles(int(kt), p->cluster, p->warps);
  const bool one_wave = units * p->cluster <= num_sms();
  const int budget = one_wave ? kTmaSmemMax : kTmaSmemTwoCtas;
  auto layout = [&](int tiles, int stages) {
    return TmaLayout(int(kt), p->cluster, p->warps, p->group, tiles, stages);
  };
  int tiles = one_wave ? (wt + 1) / 2 : std::min(wt, 4), stages = 2;
  if (layout(tiles, 2).total > budget) tiles = std::min(wt, 4);
  while (stages < kTmaMaxStages && stages * tiles < wt && layout(tiles, stages + 1).total <= budget)
    ++stages;
  const bool tma_fits = tiles >= 1 && layout(tiles, stages).total <= budget;
  if (p->tma == -1) p->tma = tma_fits && one_wave ? 1 : 0;
  // -1: unrounded with TMA (a TMA that cannot fit is refused below).
  if (p->unrounded == -1) p->unrounded = p->tma == 1 ? 1 : 0;
  if (p->tma == 1) {
    if (!tma_fits) return false;
    p->tma_tiles = tiles;
    p->tma_stages = stages;
  }
  return true;
}

bool launch_int4_split_gate_up(Int4SplitGateUpParams p, cudaStream_t stream) {
  if (!int4_split_gate_up_shape(&p)) return false;
  const int64_t units = int64_t(p.assignments) * (p.inter / kInt4TileRows);
  const int64_t kt = p.k / kInt4TileK;
  size_t smem = size_t(x_bytes(int(kt), p.cluster));  // the CTA's x
  if (p.tma) {
    static PerDeviceOnce limits;  // the TMA kernels' shared-memory limit
    limits.run(init_tma_kernels);
    smem = size_t(TmaLayout(int(kt), p.cluster, p.warps, p.group, p.tma_tiles, p.tma_stages).total);
  }
  with_kernel(p.ring, p.group, p.tma != 0, p.unrounded != 0, [&](auto kernel) {
    launch_pdl_cluster(kernel, dim3(unsigned(units * p.cluster)), dim3(unsigned(p.warps * 32)),
                       smem, Launch{stream}, p.cluster, p);
  });
  CUDA_LAUNCH_CHECK();
  return true;
}

}  // namespace strata::cuda
