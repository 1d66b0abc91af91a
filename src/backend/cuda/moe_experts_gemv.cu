// The host side of the MoE decode GEMV: its shape choice (a cost model) and launch. The kernel and
// its design: moe_experts_gemv_kernel.cuh.
#include <algorithm>
#include <cmath>

#include "backend/cuda/moe_experts_gemv_kernel.cuh"

namespace strata::cuda {
namespace {

constexpr int kMaxCluster = 8;  // portable cluster size

// ---- host ----
int nt_of(int gemv_tokens) { return gemv_tokens <= 8 ? 1 : gemv_tokens <= 16 ? 2 : 4; }
// The kernel instance's format: fp8 weights against x staged in f16 run kMoeFp8F16.
int kernel_format(const MoeGroupedParams& p) {
  return p.w.format == kMoeFp8 && (p.x_f16 != nullptr || p.stage_smem != kMoeStageNone)
             ? kMoeFp8F16
             : p.w.format;
}
// Staged x slots of the CTA-staged modes (moe_experts.h).
int64_t stage_slots(int mode, int64_t rows, int nt) {
  return mode == kMoeStagePass ? 8 * nt : mode == kMoeStageAll ? rows : 0;
}
// Dynamic shared memory: the int4 ring, or the CTA-staged x (slots · k f16, then slots floats).
template <int F, int NT, bool GLU>
size_t dynamic_smem(const MoeGroupedParams& p) {
  if constexpr (F == kMoeFp8F16) {
    const int64_t slots = stage_slots(p.stage_smem, p.rows, NT);
    return size_t(slots * p.w.k * 2 + slots * 4);
  }
  return size_t(Cfg<F, NT, GLU>::kRingBytes);
}

// Tiles per batch (Cfg::U) and register buffers (Cfg::NB) of the kernel these sizes take.
struct Pipe {
  int unroll, buffers;
  bool ring;  // Cfg::RING: the shared-memory ring (int4)
};
template <int F>
Pipe pipe_f(int nt, bool glu) {
  auto of = [](auto cfg) {
    using C = decltype(cfg);
    return Pipe{C::U, C::RING ? C::NS : C::NB, C::RING};
  };
  if (nt == 1) return glu ? of(Cfg<F, 1, true>{}) : of(Cfg<F, 1, false>{});
  if (nt == 2) return glu ? of(Cfg<F, 2, true>{}) : of(Cfg<F, 2, false>{});
  return glu ? of(Cfg<F, 4, true>{}) : of(Cfg<F, 4, false>{});
}
Pipe pipe_of(int format, int nt, bool glu) {
  return format == kMoeBf16     ? pipe_f<kMoeBf16>(nt, glu)
         : format == kMoeFp8    ? pipe_f<kMoeFp8>(nt, glu)
         : format == kMoeFp8F16 ? pipe_f<kMoeFp8F16>(nt, glu)
                                : pipe_f<kMoeInt4>(nt, glu);
}

template <int F, int NT, bool GLU>
void launch_nt(const MoeGroupedParams& p, const MoeGemvShape& sh, int64_t slots,
               cudaStream_t stream) {
  const int64_t tiles = (GLU ? p.glu_inter : p.w.n) / kMoeTileRows;
  const int64_t per_cta = int64_t(kWarps / sh.ksplit) * sh.tiles_per_warp;
  const int64_t groups = ceil_div(tiles, per_cta);
  MoeGroupedParams q = p;
  q.ksplit = sh.ksplit;
  q.cluster = sh.cluster;
  q.tiles_per_warp = sh.tiles_per_warp;
  launch_pdl_cluster(moe_gemv_kernel<F, NT, GLU>,
                     dim3(unsigned(groups * sh.cluster), unsigned(slots)), dim3(kThreads),
                     dynamic_smem<F, NT, GLU>(q), Launch{stream}, sh.cluster, q);
  CUDA_LAUNCH_CHECK();
}

template <int F, bool GLU>
void launch_format(const MoeGroupedParams& p, const MoeGemvShape& sh, int64_t slots,
                   cudaStream_t stream) {
  switch (nt_of(p.gemv_tokens)) {
    case 1:
      launch_nt<F, 1, GLU>(p, sh, slots, stream);
      break;
    case 2:
      launch_nt<F, 2, GLU>(p, sh, slots, stream);
      break;
    default:
      launch_nt<F, 4, GLU>(p, sh, slots, stream);
      break;
  }
}

template <bool GLU>
void launch_glu(const MoeGroupedParams& p, const MoeGemvShape& sh, int64_t slots,
                cudaStream_t stream) {
  switch (kernel_format(p)) {
    case kMoeBf16:
      launch_format<kMoeBf16, GLU>(p, sh, slots, stream);
      break;
    case kMoeFp8:
      launch_format<kMoeFp8, GLU>(p, sh, slots, stream);
      break;
    case kMoeFp8F16:
      launch_format<kMoeFp8F16, GLU>(p, sh, slots, stream);
      break;
    default:
      launch_format<kMoeInt4, GLU>(p, sh, slots, stream);
      break;
  }
}

bool pow2_upto8(int v) { return v == 1 || v == 2 || v == 4 || v == 8; }

template <int NT, bool GLU>
void set_ring_limit() {
  if constexpr (Cfg<kMoeInt4, NT, GLU>::kRingBytes > 0)
    CUDA_CHECK(cudaFuncSetAttribute(moe_gemv_kernel<kMoeInt4, NT, GLU>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    Cfg<kMoeInt4, NT, GLU>::kRingBytes));
}

// The ring's shape (no field forced). The cost model below assumes a wave of CTAs costs its
// set-up plus its warps' streams, which overstates many short CTAs: with the ring the next
// CTA's first stages overlap the others' streams. Measured on the Kimi-K2.5 rank (gate_up
// k = 7168, down k = 256) and Moonlight (k = 2048 / 1408) at T = 1 .. 128, every shape of the
// sweep (2026-12-01-moe-int4-decode.md), the best shapes were, within 5%: GLU, each warp's
// stream at most kRingWarpStream bytes (k split over ks warps, the fewest that give it), then
// more k split (and, at ks 8, cluster CTAs) while the grid still fits one wave and is short of
// it; plain (ring at >= 2 n-tiles), one warp per row tile's k, up to 16 batches per warp
// (tiles_per_warp).
constexpr double kRingWarpStream = 28 * 1024.0;
MoeGemvShape ring_shape(bool glu, int64_t tiles, int64_t batches, double batch_bytes, double active,
                        double slots) {
  auto ctas = [&](int ks, int cl, int r) {
    return double(cl) * double(ceil_div(tiles, int64_t(kWarps / ks) * r)) * active;
  };
  int ks = 1, cl = 1, r = 1;
  if (glu) {
    while (ks<kWarps&& double(ceil_div(batches, int64_t(ks))) * batch_bytes> kRingWarpStream)
      ks *= 2;
  } else {
    while (r < 8 && 2 * r * batches <= 16) r *= 2;
    while (r > 1 && ctas(1, 1, r) < slots) r /= 2;
  }
  while (ks < kWarps && ctas(ks, 1, r) < slots && ctas(ks * 2, 1, r) <= slots) ks *= 2;
  if (ks == kWarps)
    while (cl < kMaxCluster && ctas(ks, cl, r) < slots && ctas(ks, cl * 2, r) <= slots) cl *= 2;
  if (ks > 1 || cl > 1) r = 1;
  while (int64_t(ks) * cl > std::max<int64_t>(1, batches)) (cl > 1 ? cl : ks) /= 2;
  return MoeGemvShape{ks, cl, r};
}

}  // namespace

int moe_gemv_stage_smem(const MoeGroupedParams& p) {
  if (p.w.format != kMoeFp8 || p.x_f16 != nullptr || p.w.k % 32 != 0) return kMoeStageNone;
  auto fits = [&](int64_t slots) { return slots * p.w.k <= kMoeStageSmemElems; };
  const int64_t pass = stage_slots(kMoeStagePass, p.rows, nt_of(p.gemv_tokens));
  // Every row where x has no more rows than a pass (one token's x: one slot, not eight).
  if (p.rows <= pass && fits(p.rows)) return kMoeStageAll;
  return fits(pass) ? kMoeStagePass : kMoeStageNone;
}

void init_moe_gemv_kernels() {
  set_ring_limit<1, false>();
  set_ring_limit<1, true>();
  set_ring_limit<2, false>();
  set_ring_limit<2, true>();
  set_ring_limit<4, false>();
  set_ring_limit<4, true>();
}

MoeGemvShape moe_gemv_shape(const MoeGroupedParams& p) {
  const bool glu = p.glu_inter > 0;
  const int nt = nt_of(p.gemv_tokens);
  const int64_t tiles = (glu ? p.glu_inter : p.w.n) / kMoeTileRows;
  const Pipe pipe = pipe_of(kernel_format(p), nt, glu);
  const int unroll = pipe.unroll;
  const int64_t batches = ceil_div(moe_k_tiles(p.w.format, p.w.k), unroll);
  const double active = p.topk_ids == nullptr ? 1.0
                        : p.expect_active > 0 ? double(p.expect_active)
                                              : double(std::max(1, p.max_active));
  const double batch_bytes = double(unroll) * (glu ? 2 : 1) * kMoeTileBytes;
  // Cost model (guesses for the H200, to be calibrated by the bench's sweep, which times the
  // shapes around this choice): a CTA wave costs its set-up (plan, first loads, epilogue) plus
  // its warps' batches, each the longer of a latency over the batches in flight (buffers - 0.5
  // on average) and its share of the copy bandwidth; the grid runs in ceil(CTAs / resident
  // slots) waves (the last one as long as the others: its CTAs stream alone). Reductions add a
  // little per split level.
  constexpr double kBw = 3.8e12, kLatency = 1.2e-6, kSetup = 1.5e-6;
  constexpr double kReduceCta = 0.3e-6, kReduceCluster = 0.5e-6;
  const double slots = double(num_sms()) * kBlocksPerSm;
  if (pipe.ring && !p.ksplit && !p.cluster && !p.tiles_per_warp)
    return ring_shape(glu, tiles, batches, batch_bytes, active, slots);
  MoeGemvShape best{1, 1, 1};
  double best_t = INFINITY;
  for (int ks = 1; ks <= kWarps; ks *= 2)
    for (int cl = 1; cl <= kMaxCluster; cl *= 2)
      for (int r = 1; r <= 8; r *= 2) {
        if ((p.ksplit && ks != p.ksplit) || (p.cluster && cl != p.cluster) ||
            (p.tiles_per_warp && r != p.tiles_per_warp))
          continue;
        if ((cl > 1 && ks != kWarps) || (r > 1 && (ks > 1 || cl > 1 || glu))) continue;
        if (int64_t(ks) * cl > std::max<int64_t>(1, batches)) continue;
        const double groups = double(ceil_div(tiles, int64_t(kWarps / ks) * r));
        const double ctas = cl * groups * active;
        const double waves = std::ceil(ctas / slots);
        const double per_warp = r * std::ceil(double(batches) / double(ks * cl));
        const double warps = std::min(ctas, slots) * kWarps;
        const double t_batch = std::max(kLatency / (pipe.buffers - 0.5), batch_bytes * warps / kBw);
        const double t = waves * (kSetup + per_warp * t_batch + (ks > 1 ? kReduceCta : 0.0) +
                                  (cl > 1 ? kReduceCluster : 0.0));
        if (t < best_t * 0.97) {  // the simpler shape unless clearly better
          best_t = t;
          best = MoeGemvShape{ks, cl, r};
        }
      }
  return std::isfinite(best_t) ? best : MoeGemvShape{0, 0, 0};
}

void launch_moe_gemv(const MoeGroupedParams& p, cudaStream_t stream) {
  const char* why = nullptr;
  CHECK_MSG(moe_weight_shape_ok(p.w.format, p.w.n, p.w.k, p.w.group, &why), "moe gemv: {}", why);
  CHECK_MSG(p.glu_inter == 0 || (p.w.n == 2 * p.glu_inter && p.glu_inter % kMoeTileRows == 0),
            "moe gemv: SwiGLU needs n = 2 · inter, inter % 16 == 0 (n {}, inter {})", p.w.n,
            p.glu_inter);
  // fp8: a 128-row scale block must not straddle the gate and up halves.
  CHECK_MSG(p.glu_inter == 0 || p.w.format != kMoeFp8 || p.glu_inter % kMoeFp8Block == 0,
            "moe gemv: fp8 gate_up needs inter % 128 == 0 (inter {})", p.glu_inter);
  CHECK((p.ksplit == 0 || pow2_upto8(p.ksplit)) && (p.cluster == 0 || pow2_upto8(p.cluster)) &&
        (p.tiles_per_warp == 0 || pow2_upto8(p.tiles_per_warp)));
  CHECK(uintptr_t(p.x) % 16 == 0 && uintptr_t(p.w.values) % 16 == 0 && p.w.values_stride % 16 == 0);
  CHECK_MSG(p.x_f16 == nullptr || (p.w.format == kMoeFp8 && p.x_inv != nullptr &&
                                   uintptr_t(p.x_f16) % 16 == 0 && p.w.k % 32 == 0),
            "moe gemv: x in f16 is for fp8 weights with k % 32 == 0, with its row scales");
  CHECK_MSG(
      p.stage_smem == kMoeStageNone ||
          (p.w.format == kMoeFp8 && p.x_f16 == nullptr && p.w.k % 32 == 0 &&
           (p.stage_smem == kMoeStagePass || p.stage_smem == kMoeStageAll) &&
           stage_slots(p.stage_smem, p.rows, nt_of(p.gemv_tokens)) * p.w.k <= kMoeStageSmemElems),
      "moe gemv: stage_smem {} for format {} k {} rows {}", p.stage_smem, p.w.format, p.w.k,
      p.rows);
  const bool grouped = p.topk_ids != nullptr;
  if (grouped) {
    CHECK_MSG(p.num_experts > 0 && p.num_experts <= kMoeMaxExperts && p.x_div > 0,
              "moe gemv: {} experts, x_div {}", p.num_experts, p.x_div);
    CHECK_MSG(p.assignments < (int64_t(1) << 31), "moe gemv: {} assignments", p.assignments);
  }
  // One slot a pass of P rows (the kernel's find_pass): grouped, at most one partial pass an
  // expert plus the full ones, min(E, T·k) + T·k / P; dense, the rows' passes.
  const int64_t P = 8 * int64_t(nt_of(p.gemv_tokens));
  const int64_t slots =
      grouped ? (p.max_active > 0 ? p.max_active + p.assignments / P : 0) : ceil_div(p.rows, P);
  if (slots <= 0 || (grouped ? p.assignments : p.rows) <= 0) return;
  // x offsets are 32-bit in the kernel.
  CHECK_MSG(p.rows * p.w.k < (int64_t(1) << 31), "moe gemv: x of {} x {} too large", p.rows, p.w.k);
  // The kernel's stream position keeps a batch index in 16 bits (StreamPos).
  CHECK_MSG(p.w.k < (int64_t(1) << 20), "moe gemv: k {} too large", p.w.k);
  CHECK(slots <= 65535);
  if (p.w.format == kMoeInt4) {  // the ring's shared-memory limit
    static PerDeviceOnce limits;
    limits.run(init_moe_gemv_kernels);
  }
  const MoeGemvShape sh = moe_gemv_shape(p);
  CHECK_MSG(sh.ksplit > 0, "moe gemv: no shape fits ksplit {} cluster {} tiles_per_warp {}",
            p.ksplit, p.cluster, p.tiles_per_warp);
  if (p.glu_inter > 0)
    launch_glu<true>(p, sh, slots, stream);
  else
    launch_glu<false>(p, sh, slots, stream);
}

}  // namespace strata::cuda
