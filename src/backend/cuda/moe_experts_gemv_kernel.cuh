// The MoE decode GEMV kernel and its self-plan (the host side: moe_experts_gemv.cu).
//
// The decode regime of the MoE experts: a batched GEMV over the experts the tokens touched.
//
// ## Work decomposition
// Grid (C · row-tile groups, pass slots), clusters of C CTAs along x. Slot a takes the a-th
// pass of 8 · NT rows over the touched experts in ascending id (slots past the device count
// exit at once: the grid is sized by the host's bound min(E, T·k) + T·k / (8 · NT); dense
// mode: pass a of the rows). A CTA is 8 warps = 8 / KS tile lanes × KS k parts; the C
// CTAs of a cluster take the same row tiles and split k further, so a row tile's k is split
// over KP = KS · C warps (part q = rank · KS + warp % KS takes batches q, q + KP, ...). A warp
// streams R row tiles one after the other (R > 1 only for plain projections with KP = 1: the
// short-k down projection, whose per-CTA set-up would otherwise dominate). The host picks (KS, C,
// R) with a small cost model (moe_gemv_shape; MoeGroupedParams can force each) so that even one
// token's 8 experts fill all 132 SMs: gate_up of 8 experts has 128 row tiles, so its k is split
// over 16 warps. Partial sums meet in a fixed order: the KS warps of a CTA in shared memory, then
// the C CTAs' sums in the leader CTA's shared memory (distributed shared memory, written by the
// others between two cluster barriers); nothing is accumulated atomically.
//
// ## Each warp
// Batches of U consecutive 512-byte k tiles per matrix (one 16-byte load per lane each) go into
// NB register buffers in turn (a ring): a batch is multiplied on the tensor cores
// (mma.m16n8k16, the 16 weight rows as A, 8 rows of x per n-tile as B) while the next ones'
// loads are in flight. x is never waited on by itself (it was: one L2 round trip per batch):
// where the registers allow (Cfg::XPRE) the rows' x values of the batch's k range (B
// fragments, 32-bit pairs) are loaded with its weights; elsewhere its x lines are prefetched
// into L1 then and read from L1 when it is multiplied. GLU (gate_up): a warp holds a gate tile
// and the matching up tile, so silu(g) · u is its epilogue. An expert with more rows than
// 8 · NT streams its weights once per pass of 8 · NT rows, each pass in a slot of its own (a
// skewed batch costs bytes, never correctness).
// int4 GLU (gate_up) and int4 at two or four n-tiles (Cfg::RING) stream through a ring of NS
// stages per warp in shared memory instead of the register buffers: cp.async copies of a
// batch's tiles and each lane's scale words, NS - 1 batches in flight (~9-12 KB per warp against
// ~3 KB), x prefetched into L1 when a stage is issued (2026-12-01-moe-int4-decode.md).
//
// ## No plan kernel
// Each CTA finds its expert and rows itself from topk_ids (T·k <= a few thousand at decode):
// the experts' row counts in shared memory, slot a's pass among every expert's passes of 8 · NT
// rows (find_pass), then that pass's assignments (t, j) of the expert in ascending order (a
// ballot scan). The grid has a slot for every pass (the host's bound: min(E, T·k) + T·k / (8 ·
// NT)); slots past the passes exit at once. Rows are kept in assignment order:
// gate_up reads x row t = i / x_div and writes act row i = t·k + j; down reads act row i and
// writes y row i; the combine reads y[t·k + j]. With `early_plan` (the down projection, whose
// topk_ids were complete before its predecessor started) the plan and the first two batches of
// weights are done before pdl_wait, so they overlap the gate_up kernel's tail. Dense mode (one
// expert, rows 0..rows-1: a shared expert in the tile layout) always loads early.
#pragma once

#include "backend/cuda/cluster.cuh"
#include "backend/cuda/moe_experts_gemv_batch.cuh"
#include "backend/cuda/moe_stage_f16.cuh"

// Included by moe_experts_gemv.cu only: the unnamed namespace keeps the kernels internal to it.
namespace strata::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kBlocksPerSm = 2;  // resident at <= 128 registers per thread

// A position in a warp's stream: element s = j · nbq + i is row tile tile0 + j · tpc, batch
// q + i · kp. The loops step it once a batch (next) instead of dividing s by nbq: the two
// divisions of each consume and refill were ~50 of the FP8 f16 kernel's ~210 instructions a
// batch (SASS, session 17). j and i share one register (i < 2^16: launch_moe_gemv checks k).
struct StreamPos {
  uint32_t ji;
  __device__ __forceinline__ int j() const { return int(ji >> 16); }
  __device__ __forceinline__ int i() const { return int(ji & 0xffffu); }
  // wrap false: the stream is one row tile (GLU), i never reaches nbq inside it.
  template <bool wrap>
  __device__ __forceinline__ void next(int nbq) {
    ++ji;
    if (wrap && i() == nbq) ji += (1u << 16) - uint32_t(nbq);
  }
};

// ---- the self-plan ----
constexpr int kPassRowsMax = 32;
struct PlanSmem {
  int warp_count[kWarps];
  int rows[kPassRowsMax];  // this pass's assignments (grouped) in ascending order
};

// Slot a's work: the a-th pass (in ascending expert id, then pass) over the touched experts,
// each expert's rows split into passes of P: its expert into *e and its pass into *pass, or
// false when there are fewer passes. One slot a pass (not an expert's passes one after the
// other in one slot): a skewed batch (an expert with 128 rows) then streams its passes in
// parallel, where one CTA column streamed them in turn (a DeepSeek-V3 rank at batch 128, 8
// passes: 1.0 ms for gate_up, 2026-12-03 session 17). Every thread calls it; ids are read
// through L2 (ld.global.cg: they may be read before pdl_wait). `counts` is kMoeMaxExperts ints
// of shared memory (the kernel lends its k-split partials, unused until after the stream).
__device__ bool find_pass(const MoeGroupedParams& p, int a, int P, int* counts, int* e, int* pass) {
  const int tid = int(threadIdx.x), lane = tid % 32;
  for (int i = tid; i < kMoeMaxExperts; i += kThreads) counts[i] = 0;
  __syncthreads();
  for (int64_t i = tid; i < p.assignments; i += kThreads) {
    const int x = __ldcg(p.topk_ids + i);
    if (x >= 0 && x < p.num_experts) atomicAdd(&counts[x], 1);
  }
  __syncthreads();
  // Every warp finds it alike (no further barrier): lane l sums the passes of experts
  // 32l .. 32l + 31 (from q = l on: 32 lanes, 32 banks), a scan over the lanes finds the lane
  // holding pass a, then its experts.
  int c = 0;
  for (int q = 0; q < 32; ++q) c += (counts[32 * lane + (q + lane) % 32] + P - 1) / P;
  int inc = c;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int v = __shfl_up_sync(0xffffffffu, inc, o);
    if (lane >= o) inc += v;
  }
  const uint32_t after = __ballot_sync(0xffffffffu, inc > a);
  if (after == 0) return false;
  const int l = __ffs(after) - 1;
  int before = __shfl_sync(0xffffffffu, inc, l) - __shfl_sync(0xffffffffu, c, l);
  for (int q = 0; q < 32; ++q) {
    const int n = (counts[32 * l + q] + P - 1) / P;
    if (a < before + n) {
      *e = 32 * l + q;
      *pass = a - before;
      return true;
    }
    before += n;
  }
  return false;  // not reached: lane l holds pass a
}

// The assignments i (ascending) with topk_ids[i] == e: those of rank [skip, skip + cap) go to
// ps.rows[rank - skip]. Returns how many there are. Every thread calls it; it starts and ends
// with a barrier (ps.rows may be read by every warp once it returns).
__device__ int collect_rows(const MoeGroupedParams& p, int e, int skip, int cap, PlanSmem& ps) {
  const int tid = int(threadIdx.x), lane = tid % 32, warp = tid / 32;
  int base = 0;
  __syncthreads();
  for (int64_t i0 = 0; i0 < p.assignments; i0 += kThreads) {
    const int64_t i = i0 + tid;
    const bool m = i < p.assignments && __ldcg(p.topk_ids + i) == e;
    const uint32_t ballot = __ballot_sync(0xffffffffu, m);
    if (lane == 0) ps.warp_count[warp] = __popc(ballot);
    __syncthreads();
    int before = base, total = base;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const int n = ps.warp_count[w];
      before += w < warp ? n : 0;
      total += n;
    }
    if (m) {
      const int r = before + __popc(ballot & ((1u << lane) - 1u));
      if (r >= skip && r < skip + cap) ps.rows[r - skip] = int(i);
    }
    base = total;
    __syncthreads();
  }
  return base;
}

// ---- x staged in f16 by the CTA itself (kMoeFp8F16, MoeGroupedParams::stage_smem) ----
// Slots 0 .. slots - 1 of x rows row_of(s), each as moe_stage_f16.cuh's k / 8 pieces, into `dst`
// (shared memory; slot s at s · k / 8) and 2^-e into inv[s]. Every thread calls it (barriers);
// slots · k <= kMoeStageSmemElems, so a thread holds at most kStagePieces pieces. `rowmax` is
// `slots` words of shared memory (the kernel lends its k-split partials, unused until after the
// stream). One pass over x: each thread loads its pieces, the rows' largest |x| meet in rowmax
// (the lanes of a slot reduced in the warp first, then one shared atomicMax), then each piece is
// scaled by its row's 2^e from registers.
constexpr int kStagePieces = int(kMoeStageSmemElems / 8 / kThreads);
static_assert(kStagePieces * 8 * kThreads == kMoeStageSmemElems, "whole pieces a thread");
template <class RowOf>
__device__ void stage_rows(const bf16_bits* x, int k, int slots, RowOf row_of, uint4* dst,
                           float* inv, uint32_t* rowmax) {
  const int tid = int(threadIdx.x), lane = tid % 32, kp = k / 8, pieces = slots * kp;
  for (int s = tid; s < slots; s += kThreads) rowmax[s] = 0;
  __syncthreads();
  uint32_t w[kStagePieces][4];
#pragma unroll
  for (int u = 0; u < kStagePieces; ++u) {
    const int q = tid + u * kThreads, s = q < pieces ? q / kp : -1;
    uint32_t m = 0;
    if (s >= 0) {
      const uint32_t* src = reinterpret_cast<const uint32_t*>(x) + int64_t(row_of(s)) * (k / 2) +
                            stage_word(uint32_t(q - s * kp));
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        w[u][j] = __ldg(src + 4 * j);
        m = abs_max_bits(m, w[u][j]);
      }
    }
    const uint32_t same = __match_any_sync(0xffffffffu, s);
    m = __reduce_max_sync(same, m);
    if (s >= 0 && lane == __ffs(same) - 1) atomicMax(rowmax + s, m);
  }
  __syncthreads();
#pragma unroll
  for (int u = 0; u < kStagePieces; ++u) {
    const int q = tid + u * kThreads;
    if (q >= pieces) break;
    const int s = q / kp, e = stage_exponent(rowmax[s]);
    dst[q] = stage_piece(w[u], pow2f(e));
    if (q == s * kp) inv[s] = pow2f(-e);
  }
  __syncthreads();
}

template <int F, int NT, bool GLU>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm) moe_gemv_kernel(MoeGroupedParams p) {
  using C = Cfg<F, NT, GLU>;
  constexpr int NM = C::NM, U = C::U;
  constexpr int kAcc = NM * NT * 4;
  // k-split partials: [warp][accumulator][lane]; after the CTA's own sum, the leader's copy
  // receives the other cluster CTAs' sums (rank r in slot r - 1).
  __shared__ float red[kWarps][kAcc][32];
  __shared__ PlanSmem ps;
  static_assert(sizeof(red) >= kMoeMaxExperts * sizeof(int), "find_pass borrows red");
  if (p.pdl_early) pdl_trigger();
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int g = lane / 4, c = lane % 4;
  // GLU: one row tile per warp (its long k needs no more; R > 1 cost the int4 kernel spills).
  const int ks = p.ksplit, cl = p.cluster, R = GLU ? 1 : p.tiles_per_warp;
  const int rank = cl > 1 ? int(cluster_rank()) : 0;
  const int part = warp % ks, kp = ks * cl, q = rank * ks + part;
  const int tpc = kWarps / ks;  // row tiles per CTA step (tile lanes)
  const int group = int(blockIdx.x) / cl;
  const int tiles = int((GLU ? p.glu_inter : p.w.n) / kMoeTileRows);
  const int tile0 = group * tpc * R + warp / ks;  // row tile j: tile0 + j · tpc
  const int k = int(p.w.k), kt_count = (k + C::TK - 1) / C::TK;
  const int batches = (kt_count + U - 1) / U;
  const int nbq = q < batches ? (batches - q + kp - 1) / kp : 0;  // this part's batches per tile
  int rv = 0;                                                     // this warp's valid row tiles
  for (int j = 0; j < R; ++j) rv += tile0 + j * tpc < tiles;
  const int len = rv * nbq;  // the warp's stream of (row tile, batch)
  const bool grouped = p.topk_ids != nullptr;
  const bool early = !grouped || p.early_plan;  // plan inputs readable before pdl_wait
  // kMoeFp8F16 reads x staged in f16 (2-byte elements, the same offsets; by a launch before this
  // one, x_f16, or by this CTA into shared memory, stage_smem) and scales each output by its
  // row's 1 / 2^e.
  const int stage = F == kMoeFp8F16 ? p.stage_smem : kMoeStageNone;
  const bf16_bits* xs = F != kMoeFp8F16          ? p.x
                        : stage != kMoeStageNone ? reinterpret_cast<const bf16_bits*>(moe_gemv_ring)
                                                 : reinterpret_cast<const bf16_bits*>(p.x_f16);

  // Expert, pass and rows. Grouped: slot blockIdx.y's (expert, pass) (find_pass); dense:
  // expert 0, rows 0..rows-1, pass blockIdx.y. The pass's rows are c0 .. c0 + 8 · NT - 1 of
  // the expert's count.
  int e = 0;
  int count = int(p.rows);  // < 2^31: rows · k is
  int c0 = int(blockIdx.y) * 8 * NT;
  auto plan = [&]() {
    if (!grouped) return c0 < count;
    int pass = 0;
    if (!find_pass(p, int(blockIdx.y), 8 * NT, reinterpret_cast<int*>(&red[0][0][0]), &e, &pass))
      return false;
    c0 = pass * 8 * NT;
    count = collect_rows(p, e, c0, 8 * NT, ps);
    return true;
  };
  Work wk;
  auto set_work = [&]() {
    wk.w_base = reinterpret_cast<const uint4*>(static_cast<const char*>(p.w.values) +
                                               int64_t(e) * p.w.values_stride) +
                lane;
    wk.s_base = static_cast<const char*>(p.w.scales) + int64_t(e) * p.w.scales_stride +
                (F == kMoeInt4 ? (lane / 4) * 4 : 0);
    wk.glu_tiles = GLU ? int(p.glu_inter / kMoeTileRows) : 0;
    wk.kt_count = kt_count;
    wk.k = k;
    wk.scale_row_words = F == kMoeInt4 ? int(int4_scale_groups(k, p.w.group)) * 8 : 0;
    wk.scale_cols = (k + kMoeFp8Block - 1) / kMoeFp8Block;
    wk.gshift = __ffs(p.w.group) - 1;
    wk.group32 = p.w.group == 32;
  };
  // Stream positions (StreamPos): at(s) divides once (the prologue); rt and kt are its row
  // tile and first k tile.
  auto at = [&](int s) {
    return nbq > 0 ? StreamPos{uint32_t(s / nbq) << 16 | uint32_t(s % nbq)} : StreamPos{0};
  };
  // (GLU: one row tile a warp, so the row's addresses are loop invariants.)
  auto rt_of = [&](const StreamPos& e) { return GLU ? tile0 : tile0 + e.j() * tpc; };
  auto kt_of = [&](const StreamPos& e) { return (q + e.i() * kp) * U; };

  // Register ring (NB buffers: buf[b] holds stream elements b, b + NB, ...) or, int4, the
  // shared-memory ring (NS stages: element s in stage s % NS; NB is its prologue's length).
  constexpr bool RING = C::RING;
  constexpr int NS = C::NS;
  constexpr int NB = RING ? NS - 1 : C::NB;
  Batch<F, NT, GLU> buf[RING ? 1 : NB];
  const uint32_t ring = RING ? uint32_t(__cvta_generic_to_shared(moe_gemv_ring)) +
                                   uint32_t(warp * NS * C::kStageBytes)
                             : 0u;
  const char* ring_ptr = reinterpret_cast<const char*>(moe_gemv_ring) + warp * NS * C::kStageBytes;
  // RING: element s (at e) into its stage (one commit group, empty past len).
  auto issue = [&](int s, const StreamPos& e) {
    const bool ok = s < len;
    ring_issue<F, NT, GLU>(ring + uint32_t((s % NS) * C::kStageBytes), wk, ok ? rt_of(e) : 0,
                           ok ? kt_of(e) : 0, ok);
  };
  auto first_loads = [&]() {
    if constexpr (RING) {
#pragma unroll
      for (int b = 0; b < NB; ++b) issue(b, at(b));
    } else {
#pragma unroll
      for (int b = 0; b < NB; ++b)
        load_w(buf[b], wk, len > b ? rt_of(at(b)) : 0, len > b ? kt_of(at(b)) : 0, len > b);
    }
  };
  bool live = true;
  if (early) {
    live = plan();
    if (live) {
      set_work();
      first_loads();
    }
  }
  pdl_wait();
  if (!p.pdl_early) pdl_trigger();
  if (!early) {
    live = plan();
    if (live) {
      set_work();
      first_loads();
    }
  }
  if (!live) return;  // the whole cluster (the same slot): no cluster barrier is pending
  {                   // the slot's one pass
    const int rows = min(8 * NT, count - c0);  // this pass's rows
    const int nt = (rows + 7) / 8;
    // Row r of the pass: x row and output row.
    auto x_row = [&](int r) { return grouped ? ps.rows[r] / p.x_div : c0 + r; };
    auto out_row = [&](int r) { return grouped ? ps.rows[r] : c0 + r; };
    // Staged by this CTA: slot r holds the pass's row r (kMoeStagePass) or slot t x row t
    // (kMoeStageAll); 2^-e of slot s at inv_smem[s], after the slots' pieces.
    float* inv_smem = nullptr;
    auto slot_of = [&](int r) { return stage == kMoeStagePass ? r : x_row(r); };
    if (stage != kMoeStageNone) {
      const int cap = stage == kMoeStagePass ? 8 * NT : int(p.rows);
      inv_smem = reinterpret_cast<float*>(moe_gemv_ring + cap * (k / 8));
      uint32_t* rowmax = reinterpret_cast<uint32_t*>(&red[0][0][0]);
      if (stage == kMoeStagePass)
        stage_rows(p.x, k, rows, x_row, moe_gemv_ring, inv_smem, rowmax);
      else
        stage_rows(
            p.x, k, cap, [](int s) { return s; }, moe_gemv_ring, inv_smem, rowmax);
    }
    // 1 / 2^e of the pass's row r (kMoeFp8F16).
    auto inv_of = [&](int r) {
      return stage != kMoeStageNone ? inv_smem[slot_of(r)] : __ldg(p.x_inv + x_row(r));
    };
    int32_t xrow[NT];
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      const int r = 8 * j + g;
      // kMoeFp8F16: x in the fp8 tiles' fragment order (a lane's 8 values of a tile at 8c).
      xrow[j] = r < rows ? (F == kMoeFp8F16 ? slot_of(r) * k + 8 * c : x_row(r) * k + 2 * c) : -1;
    }
#pragma unroll
    for (int b = 0; b < NB; ++b)
      if (len > b) load_x(buf[RING ? 0 : b], xs, xrow, kt_of(at(b)), k);

    float acc[NM][NT][4];
    auto zero = [&]() {
#pragma unroll
      for (int mt = 0; mt < NM; ++mt)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
          for (int i = 0; i < 4; ++i) acc[mt][j][i] = 0.0f;
    };
    // Stores row tile rt's outputs of this pass from acc.
    // kMoeFp8F16: the 1 / 2^e of the rows this lane stores (8j + 2c + e2), read once a pass at
    // one or two n-tiles (the store's x_row divides; the down projection stores every 8 k
    // tiles), in the store at four (registers).
    constexpr bool kPassInv = F == kMoeFp8F16 && NT <= 2;
    float pass_inv[kPassInv ? NT : 1][2];
    if constexpr (kPassInv) {
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e2 = 0; e2 < 2; ++e2) {
          const int r = 8 * j + 2 * c + e2;
          pass_inv[j][e2] = r < rows ? inv_of(r) : 0.0f;
        }
    }
    auto store = [&](int rt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t col = int64_t(rt) * kMoeTileRows + g + 8 * h;
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
          for (int e2 = 0; e2 < 2; ++e2) {
            const int r = 8 * j + 2 * c + e2;
            if (j >= nt || r >= rows) continue;
            float v = acc[0][j][2 * h + e2];
            [[maybe_unused]] float u = acc[NM - 1][j][2 * h + e2];
            if constexpr (F == kMoeFp8F16) {
              const float inv = kPassInv ? pass_inv[kPassInv ? j : 0][e2] : inv_of(r);
              v *= inv;
              u *= inv;
            }
            if constexpr (GLU) v = silu(round_bf16(v)) * round_bf16(u);
            p.out[int64_t(out_row(r)) * (GLU ? p.glu_inter : p.w.n) + col] = float_to_bf16(v);
          }
      }
    };
    auto consume = [&](const StreamPos& e, const Batch<F, NT, GLU>& b) {
      mma_batch<F, NT, GLU>(acc, b, xs, xrow, nt, kt_of(e), k);
      if (kp == 1 && e.i() == nbq - 1) {  // the tile's last batch: its outputs (no k split)
        store(rt_of(e));
        zero();
      }
    };
    auto refill = [&](int s, const StreamPos& e, Batch<F, NT, GLU>& b) {
      if (s >= len) return;
      load_w(b, wk, rt_of(e), kt_of(e), true);
      load_x(b, xs, xrow, kt_of(e), k);
    };
    zero();
    if constexpr (RING) {
      // Groups committed on entry to iteration s: NS - 1 + s (elements 0 .. NS - 2 + s); the
      // oldest s + 1 done leaves NS - 2 pending. Element s + NS - 1 goes into the stage that
      // element s - 1 left (read back by this lane alone, into registers already used).
      StreamPos ce = at(0), ie = at(NS - 1);  // consumed, issued
      for (int s = 0; s < len; ++s) {
        ring_wait<NS - 2>();
        issue(s + NS - 1, ie);
        if (s + NS - 1 < len) load_x(buf[0], xs, xrow, kt_of(ie), k);
        ie.next<!GLU>(nbq);
        ring_take(buf[0], ring_ptr + (s % NS) * C::kStageBytes, wk.group32);
        consume(ce, buf[0]);
        ce.next<!GLU>(nbq);
      }
    } else {
      // buf[b] holds element s + b on entry to each iteration; it is refilled with element
      // s + b + NB as soon as it has been multiplied.
      StreamPos ce = at(0), re = at(NB);  // consumed, refilled
      for (int s = 0; s < len; s += NB) {
#pragma unroll
        for (int b = 0; b < NB; ++b) {
          if (s + b >= len) break;
          consume(ce, buf[b]);
          ce.next<!GLU>(nbq);
          refill(s + b + NB, re, buf[b]);
          re.next<!GLU>(nbq);
        }
      }
    }
    if (kp > 1) {    // R == 1: one row tile per warp, its k split over kp warps
      if (ks > 1) {  // the CTA's k-split warps, in warp order
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
          for (int w = 1; w < ks; ++w)
#pragma unroll
            for (int mt = 0; mt < NM; ++mt)
#pragma unroll
              for (int j = 0; j < NT; ++j)
#pragma unroll
                for (int i = 0; i < 4; ++i)
                  acc[mt][j][i] += red[warp + w][(mt * NT + j) * 4 + i][lane];
        }
        __syncthreads();  // red is free again
      }
      if (cl > 1) {      // the cluster's CTAs, in rank order (ks == 8: one row tile per CTA)
        cluster_sync();  // the leader's red is free; every CTA of the cluster is running
        if (rank != 0 && part == 0) {
          const uint32_t dst =
              cluster_map(uint32_t(__cvta_generic_to_shared(&red[rank - 1][0][lane])), 0);
#pragma unroll
          for (int mt = 0; mt < NM; ++mt)
#pragma unroll
            for (int j = 0; j < NT; ++j)
#pragma unroll
              for (int i = 0; i < 4; ++i)
                st_cluster(dst + uint32_t(((mt * NT + j) * 4 + i) * 32 * 4), acc[mt][j][i]);
        }
        cluster_sync();  // the sums have landed
        if (rank == 0 && part == 0) {
          for (int r = 1; r < cl; ++r)
#pragma unroll
            for (int mt = 0; mt < NM; ++mt)
#pragma unroll
              for (int j = 0; j < NT; ++j)
#pragma unroll
                for (int i = 0; i < 4; ++i)
                  acc[mt][j][i] += red[r - 1][(mt * NT + j) * 4 + i][lane];
        }
      }
      if (rank == 0 && part == 0 && len > 0) store(tile0);
    }
  }
}

}  // namespace
}  // namespace strata::cuda
