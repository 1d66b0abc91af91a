// The register GEMV's launch plan: choose_reg (linear_int4_reg_plan.cuh) and the queries
// linear_int4.h declares on it. The kernel and its instantiations: linear_int4_reg.cu.
#include <algorithm>

#include "backend/cuda/linear_int4.cuh"
#include "backend/cuda/linear_int4_reg_plan.cuh"
#include "backend/cuda/norm_prologue.cuh"

namespace strata::cuda {
namespace int4_reg {
using namespace int4;
namespace {

uint32_t align16(uint64_t v) { return uint32_t((v + 15) / 16 * 16); }

}  // namespace

bool choose_reg(const Int4LinearParams& p, const Int4RegExperts* ex, RegLaunch* out) {
  if (p.m < 1 || p.m > kMaxTokens || p.group > kMaxGroup || !int4_group_supported(p.group) ||
      p.k % p.group != 0 || p.k <= 0)
    return false;
  RegLaunch r;
  r.warps = p.gemv_warps > 0 ? p.gemv_warps : kDefaultWarps;
  r.unroll = p.gemv_unroll > 0 ? p.gemv_unroll : kDefaultUnroll;
  r.round = p.gemv_round != 0;
  if (r.warps > kMaxWarps || (r.unroll != 8 && r.unroll != 16)) return false;
  // int4_norm_fusion.cc's merges: the norm dense, m <= 2, k as norm.h's kVecOnePass; the residual.
  const bool x_norm = p.norm.x != nullptr;
  if ((x_norm && (ex != nullptr || p.m > 2 || p.k % 8 != 0 || p.k <= 256 || p.k > 8192)) ||
      (p.residual != nullptr && (ex != nullptr || p.glu_inter > 0)))
    return false;
  if (p.group == 32) r.unroll = 8;  // the only ring size of group 32 (for_each_kernel)
  // Row tiles a position: 4 where instantiated (ring 8, whole groups in its 2 positions), else 1.
  if (p.gemv_rows != 0 && p.gemv_rows != 1 && p.gemv_rows != 4) return false;
  r.rows = p.gemv_rows == 4 && r.unroll == 8 && p.group <= 128 ? 4 : 1;
  if (p.gemv_trigger < 0 || p.gemv_trigger > kInt4TriggerLate || p.gemv_depth < 0) return false;
  const int64_t units = p.glu_inter > 0 ? p.glu_inter / kInt4TileRows : int4_row_tiles(p.n);
  // Blocks over which one matrix's row tiles are split: the grid (dense), or each assignment's
  // share of two blocks per SM (experts; the registers allow two resident).
  int split = 0;
  if (ex == nullptr) {
    r.grid = int(std::max<int64_t>(
        1, std::min<int64_t>(ceil_div(units, r.rows), p.gemv_grid > 0 ? p.gemv_grid : num_sms())));
    split = r.grid;
  } else {
    // Work items: assignments (ids, one row each: m = 1) or plan tiles (up to 8 rows: m = 8
    // sizes the shared memory, each block takes its tile's rows).
    const bool by_ids = ex->ids != nullptr;
    const int64_t items = by_ids ? ex->assignments : ex->max_tiles;
    if (by_ids == (ex->tiles != nullptr) || items < 1 || ex->num_experts < 1 ||
        (by_ids && p.m != 1) || p.bias != nullptr || (p.glu_inter > 0 && p.n != 2 * p.glu_inter) ||
        (p.preload && !ex->ids_early) || (by_ids && ex->x_div < 1) ||
        (!by_ids && (ex->counts == nullptr || ex->offsets == nullptr)))
      return false;
    // Two blocks per SM over the items, and at most kExpertUnitsPerBlock row tiles a block (a
    // block keeps every row tile's partial sums in shared memory until its epilogue: with many
    // items, a whole down projection per block would leave room for one block per SM).
    const int64_t target = p.gemv_grid > 0 ? p.gemv_grid : 2 * int64_t(num_sms());
    const int64_t max_units = ex->max_units > 0 ? ex->max_units : kExpertUnitsPerBlock;
    split = int(std::clamp<int64_t>(
        std::max({target / items, ceil_div(units, max_units), int64_t(ex->min_split)}), 1,
        ceil_div(units, r.rows)));
    if (int64_t(split) * items > int64_t(1) << 30) return false;
    r.grid = split * int(items);
  }
  // The kernel's tile indices are 32-bit.
  if (!int4_tile_index_fits(int4_row_tiles(p.n) * int4_k_tiles(p.k),
                            ex != nullptr ? ex->num_experts : 1))
    return false;
  Int4RegPlan& pl = r.pl;
  pl = Int4RegPlan{};
  if (ex != nullptr) {
    pl.experts = *ex;
    pl.expert_tiles = int4_row_tiles(p.n) * int4_k_tiles(p.k);
    pl.blocks_per_assignment = split;
  }
  const bool glu = p.glu_inter > 0;
  pl.kt = int(int4_k_tiles(p.k));
  pl.units = int(units);
  pl.inter_tiles = glu ? pl.units : 0;
  pl.trigger = p.gemv_trigger != 0 ? p.gemv_trigger : kInt4TriggerEarly;
  const int64_t tpg = p.group == 32 ? 1 : p.group / kInt4TileK;
  // The longest warp part (part_start in the kernel, in positions of r.rows row tiles) and the
  // row tiles it can touch.
  const int64_t positions = (glu ? 2 : 1) * ceil_div(ceil_div(pl.units, r.rows), split) * pl.kt;
  const int64_t len = ceil_div(positions / tpg, r.warps) * tpg;
  pl.slots = int(len == 0 ? 1 : ((pl.kt + len - 2) / pl.kt + 1) * r.rows);
  uint64_t off = uint64_t(p.m) * pl.kt * 128;  // x
  pl.off_part = align16(off);
  off = pl.off_part + uint64_t(r.warps) * pl.slots * 16 * p.m * 4;
  pl.off_span = align16(off);
  off = pl.off_span + uint64_t(r.warps) * 8;
  pl.off_xrow = align16(off);
  off = pl.off_xrow + kMaxTokens * 4;
  // gemv_x_tma: dense x of up to that many bytes (rows contiguous, 16-byte aligned) by one bulk
  // copy into its own region (the fragment order is a permutation of 4-byte words: no copy
  // engine writes it), where the shared memory has room for it.
  const uint64_t x_bytes = uint64_t(p.m) * uint64_t(p.k) * 2, x_raw = (off + 127) / 128 * 128;
  if (p.gemv_x_tma < 0 || off > uint64_t(kSmemMax)) return false;
  if (x_norm) {  // the normalized rows, and the norm warps' sums
    pl.off_xraw = uint32_t(x_raw);
    off = x_raw + norm_prologue_smem_bytes(int(p.m), p.k);
    if (off > uint64_t(kSmemMax)) return false;
  } else if (ex == nullptr && x_bytes <= uint64_t(p.gemv_x_tma) && x_raw + x_bytes <= kSmemMax &&
             reinterpret_cast<uintptr_t>(p.x) % 16 == 0) {
    pl.off_xraw = uint32_t(x_raw);
    off = x_raw + x_bytes;
  }
  pl.bytes = align16(off);
  // One dense token whose x arrives whole in shared memory (bulk copy or norm prologue; no
  // padded k tile): the lanes read their B fragments from that row (the kernel's kRawX),
  // instantiated for the default ring (8) with unrounded weights and one row tile a position.
  r.raw_x = ex == nullptr && p.m == 1 && p.k % kInt4TileK == 0 && pl.off_xraw != 0 && !r.round &&
            r.rows == 1 && r.unroll == 8;
  // Padding to a residency depth: at most `depth` blocks (this kernel's, its successor's) share
  // an SM. By default none: the registers already allow only two blocks of 8 warps (~128 per
  // thread), and a large shared-memory request would make the SM's carveout differ from the
  // kernels around it (an SM changes its carveout only when idle, so a block of the next kernel
  // could not be placed beside one of the previous).
  r.smem = pl.bytes;
  if (p.gemv_depth > 0) {
    const int pad = std::min(kSmemMax, kSmemPerSm / p.gemv_depth - kSmemPerBlockReserved);
    r.smem = std::max(pl.bytes, uint32_t(pad) / 128 * 128);
  }
  *out = r;
  return true;
}

}  // namespace int4_reg

using int4_reg::choose_reg;
using int4_reg::RegLaunch;

int int4_gemv_reg_rows(const Int4LinearParams& p) {
  RegLaunch r;
  return choose_reg(p, nullptr, &r) ? r.rows : 0;
}

bool int4_gemv_reg_x_tma(const Int4LinearParams& p) {
  RegLaunch r;
  return choose_reg(p, nullptr, &r) && r.pl.off_xraw != 0 && p.norm.x == nullptr;
}

bool int4_gemv_reg_fits(const Int4LinearParams& p, const Int4RegExperts* experts) {
  RegLaunch r;
  return choose_reg(p, experts, &r);
}

}  // namespace strata::cuda
