// MoE decode with INT4 experts through the register GEMV's experts modes (linear_int4.h
// Int4RegExperts), in place of the grouped MoE GEMV (moe_experts_gemv.cu): launch_moe_experts
// (moe_experts.cu) calls these, then its combine. Each returns false, launching nothing, where a
// projection does not fit the register GEMV.
#include "backend/cuda/linear_int4.cuh"
#include "backend/cuda/moe_experts_int4_reg.h"

namespace strata::cuda {

namespace {

// One projection of the experts as the register GEMV takes it: m rows (1 by ids, the plan's tile
// rows when planned), the dense default's ring (CudaTunables::int4_gemv_ring: 8).
Int4LinearParams expert_params(const MoeExpertsParams& p, const MoeWeights& w, const bf16_bits* x,
                               bf16_bits* out, int64_t m) {
  auto q = Int4LinearParams{};
  q.x = x;
  q.packed = w.values;
  q.scale = static_cast<const bf16_bits*>(w.scales);
  q.out = out;
  q.m = m;
  q.n = w.n;
  q.k = w.k;
  q.group = w.group;
  q.gemv_unroll = 8;
  // Weights rounded to bf16 before the mma, as the other MoE kernels and the CPU twin dequantize
  // (moe_experts.h numerics), unless int4_reg_round is off (every INT4 kernel unrounded: a tiny
  // layer's NMSE against the twin went from ~1.5e-5 to 4.3e-5, MoeBackend.ExpertsMatchCpu, H 64
  // I 32 T 2); gate_up's own choice (int4_gate_up_round) is set by the callers below.
  q.gemv_round = p.int4_reg_round != 0;
  q.gemv_rows = p.int4_reg_rows;
  return q;
}

// The flat down projection's weights, x and y (moe_experts_int4_flat.cu); the caller sets its
// items (plan or ids).
Int4FlatDownParams flat_down_params(const MoeExpertsParams& p, const bf16_bits* act, bf16_bits* y) {
  Int4FlatDownParams f{};
  f.x = act;
  f.packed = p.down.values;
  f.scale = static_cast<const bf16_bits*>(p.down.scales);
  f.out = y;
  f.row_tiles = int(int4_row_tiles(p.down.n));
  f.expert_tiles = int64_t(f.row_tiles) * int4_k_tiles(p.down.k);
  f.n = p.down.n;
  f.k = p.down.k;
  f.num_experts = p.num_experts;
  f.group = p.down.group;
  f.ctas_per_sm = p.int4_flat_ctas_per_sm;
  return f;
}

// The gate_up projection by ids with k split over a cluster (moe_experts_int4_gate_up.cu), the
// knobs' shape (0: the launcher's).
Int4SplitGateUpParams split_gate_up_params(const MoeExpertsParams& p, const bf16_bits* x,
                                           bf16_bits* act) {
  Int4SplitGateUpParams s{};
  s.x = x;
  s.packed = p.gate_up.values;
  s.scale = static_cast<const bf16_bits*>(p.gate_up.scales);
  s.out = act;
  s.ids = p.topk_ids;
  s.k = p.gate_up.k;
  s.inter = p.down.k;
  s.expert_tiles = int4_row_tiles(p.gate_up.n) * int4_k_tiles(p.gate_up.k);
  s.assignments = int(p.tokens * p.top_k);
  s.x_div = p.top_k;
  s.num_experts = p.num_experts;
  s.group = p.gate_up.group;
  s.cluster = p.int4_split_cluster;
  s.warps = p.int4_split_warps;
  s.ring = p.int4_split_ring;
  s.tma = p.int4_split_tma;
  s.unrounded = p.int4_split_round == 1 ? 0 : p.int4_split_round == 0 ? 1 : -1;
  return s;
}

}  // namespace

// The decode path for a few INT4 assignments (T · k <= p.int4_reg_max_assignments): gate_up and
// down as the register GEMV's experts mode, one matrix per assignment (linear_int4.h), in place
// of the grouped GEMV. Measured first on one Kimi-K2.5 rank at T = 1 (2026-12-02): the grouped
// GEMV's gate_up and down took 19.9 + 13.4 us for 24.7 MB of weights, ~18% of copy bandwidth.
// The rows stay in assignment order (act and y rows i = t · k + j), as the combine reads them.
// False (nothing launched) where either projection does not fit the register GEMV.
bool launch_moe_int4_reg(const MoeExpertsParams& p, bf16_bits* act, bf16_bits* y,
                         cudaStream_t stream) {
  const int64_t hidden = p.down.n, inter = p.down.k;
  Int4LinearParams gate_up = expert_params(p, p.gate_up, p.x, act, 1);
  gate_up.glu_inter = inter;
  gate_up.gemv_round = p.int4_reg_round && p.int4_gate_up_round;
  gate_up.gemv_warps = p.int4_reg_gate_up_warps;
  // The ids are written by the kernel just before: the expert is known only after the wait, and
  // the trigger comes after it, so that down may read the ids before its own wait.
  gate_up.gemv_trigger = kInt4TriggerAfterWait;
  const Int4RegExperts by_token{p.topk_ids, p.tokens * p.top_k, p.top_k, p.num_experts,
                                0,          p.int4_reg_split};
  Int4LinearParams down = expert_params(p, p.down, act, y, 1);
  down.preload = 1;  // its expert is known before its wait: the weights stream from the start
  const Int4RegExperts by_row{p.topk_ids,        p.tokens * p.top_k,   1, p.num_experts, 1,
                              0 /* own split */, p.int4_reg_down_units};
  const bool flat =
      p.int4_reg_flat_down && p.int4_reg_round && int4_flat_down_fits(p.down.k, p.down.group, 1);
  Int4SplitGateUpParams split{};
  bool split_ok = false;
  if (p.int4_split_gate_up && p.int4_reg_round) {
    split = split_gate_up_params(p, p.x, act);
    split_ok = int4_split_gate_up_shape(&split);
  }
  if (gate_up.n != 2 * inter || gate_up.k != hidden ||
      (!split_ok && !int4_gemv_reg_fits(gate_up, &by_token)) ||
      (!flat && !int4_gemv_reg_fits(down, &by_row)))
    return false;
  if (split_ok)
    CHECK(launch_int4_split_gate_up(split, stream));
  else
    launch_int4_gemv_reg(gate_up, stream, &by_token);
  if (flat) {
    Int4FlatDownParams f = flat_down_params(p, act, y);
    f.ids = p.topk_ids;
    f.tile_rows = 1;
    f.max_tiles = int(p.tokens * p.top_k);
    CHECK(launch_int4_flat_down(f, stream));
  } else {
    launch_int4_gemv_reg(down, stream, &by_row);
  }
  return true;
}

// The batch-1 step as three launches where it was four (moe_experts_int4_reg.h): the split
// gate_up, then down and combine in one (moe_experts_int4_down_combine.cu).
bool launch_moe_int4_down_combined(const MoeExpertsParams& p, bf16_bits* act, cudaStream_t stream) {
  if (p.tokens != 1 || p.top_k > kInt4DownCombineMaxTopK || p.norm_out != nullptr ||
      !p.int4_reg_round || !p.int4_split_gate_up || p.gate_up.n != 2 * p.down.k ||
      p.gate_up.k != p.down.n || !int4_flat_down_fits(p.down.k, p.down.group, 1))
    return false;
  Int4SplitGateUpParams split = split_gate_up_params(p, p.x, act);
  if (!int4_split_gate_up_shape(&split)) return false;
  CHECK(launch_int4_split_gate_up(split, stream));
  // The shared experts' branch (`add`) joins here, not before the combine: the combine is the
  // next launch.
  if (p.join_event != nullptr) CUDA_CHECK(cudaStreamWaitEvent(stream, p.join_event, 0));
  Int4DownCombineParams d{};
  d.x = act;
  d.packed = p.down.values;
  d.scale = static_cast<const bf16_bits*>(p.down.scales);
  d.ids = p.topk_ids;
  d.weights = p.topk_weights;
  d.add = p.add;
  d.out = p.out;
  d.row_tiles = int(int4_row_tiles(p.down.n));
  d.expert_tiles = int64_t(d.row_tiles) * int4_k_tiles(p.down.k);
  d.n = p.down.n;
  d.k = p.down.k;
  d.top_k = p.top_k;
  d.num_experts = p.num_experts;
  d.group = p.down.group;
  CHECK(launch_int4_down_combine(d, stream));
  return true;
}

// The decode path for more INT4 assignments (p.int4_reg_planned): a plan with tiles of up to 8
// rows of one expert, then gate_up and down as the register GEMV's planned experts mode: each
// touched expert's bytes are read once per tile (the grouped GEMV reads them once per pass of up
// to 32 rows, but measured 42% of copy bandwidth on a Kimi-K2.5 rank at batch 128, 2026-12-02).
// act and y rows are in the plan's permuted order; the combine reads them through pos.
// False (nothing launched) where either projection does not fit the register GEMV.
bool launch_moe_int4_reg_planned(const MoeExpertsParams& p, const MoePlan& plan, bf16_bits* act,
                                 bf16_bits* y, cudaStream_t stream) {
  const int64_t hidden = p.down.n, inter = p.down.k, n = p.tokens * p.top_k;
  // A tile's x (tile rows x k bf16) sits in shared memory: 8 rows while gate_up's x is <= 64 KB
  // (two blocks per SM stay resident), else 4.
  const int tile_rows = p.int4_reg_tile_rows == 4 || p.int4_reg_tile_rows == 8
                            ? p.int4_reg_tile_rows
                            : (hidden * 8 * 2 <= 64 * 1024 ? 8 : 4);
  Int4RegExperts ex{};
  ex.num_experts = p.num_experts;
  ex.tiles = plan.tiles;
  ex.counts = plan.counts;
  ex.offsets = plan.offsets;
  ex.max_tiles = moe_max_tiles(n, p.num_experts, tile_rows);
  Int4LinearParams gate_up = expert_params(p, p.gate_up, p.x, act, tile_rows);
  gate_up.glu_inter = inter;
  gate_up.gemv_round = p.int4_reg_round && p.int4_gate_up_round;
  gate_up.gemv_warps = p.int4_reg_gate_up_warps;
  gate_up.gemv_trigger = kInt4TriggerAfterWait;  // down reads the plan before its wait
  Int4RegExperts gate_up_ex = ex;
  gate_up_ex.row_token = plan.row_token;
  gate_up_ex.min_split = p.int4_reg_split;  // down's items are short (k = inter): its own split
  Int4LinearParams down = expert_params(p, p.down, act, y, tile_rows);
  down.preload = 1;
  down.gemv_warps = p.int4_reg_down_warps;
  Int4RegExperts down_ex = ex;
  down_ex.ids_early = 1;
  down_ex.max_units = p.int4_reg_down_units;
  const bool flat = p.int4_reg_flat_down && p.int4_reg_round &&
                    int4_flat_down_fits(p.down.k, p.down.group, tile_rows);
  if (gate_up.n != 2 * inter || gate_up.k != hidden || !int4_gemv_reg_fits(gate_up, &gate_up_ex) ||
      (!flat && !int4_gemv_reg_fits(down, &down_ex)))
    return false;
  MoePlanParams pp{};
  pp.topk_ids = p.topk_ids;
  pp.plan = plan;
  pp.assignments = n;
  pp.top_k = p.top_k;
  pp.num_experts = p.num_experts;
  pp.tile_rows = tile_rows;
  pp.pdl_early = p.pdl_early;
  launch_moe_plan(pp, stream);
  launch_int4_gemv_reg(gate_up, stream, &gate_up_ex);
  if (flat) {
    Int4FlatDownParams f = flat_down_params(p, act, y);
    f.tiles = plan.tiles;
    f.counts = plan.counts;
    f.offsets = plan.offsets;
    f.tile_rows = tile_rows;
    f.max_tiles = int(ex.max_tiles);
    CHECK(launch_int4_flat_down(f, stream));
  } else {
    launch_int4_gemv_reg(down, stream, &down_ex);
  }
  return true;
}

}  // namespace strata::cuda
