// MoE experts on the GPU: the plan, the weight repack and the step that strings them together
// with the grouped GEMMs (moe_experts_gemv.cu, moe_experts_gemm.cu) and the combine
// (moe_combine.cu).
//
// ## Design
// No host synchronization: the host knows T, k and E only, so every grid is sized by a bound
// (experts with rows <= min(E, T·k); GEMM tiles <= ceil(T·k / BM) + min(E, T·k)) and CTAs past
// the device's counts exit at once. A MoE step is then a fixed sequence of launches whose
// parameter bytes depend on T only: CUDA-graph capturable.
// Decode (few rows per expert) has no plan: each GEMV CTA finds its expert (the a-th touched
// one) and its rows (the assignments with that expert, ascending) from topk_ids, and rows stay
// in assignment order i = t·k + j, so act, y and the combine need no permutation. At T = 1 the
// plan kernel was a launch of its own (2.6 us) for 8 assignments.
// Prefill: the permuted order, expert e's rows [offsets[e], offsets[e + 1]), experts ascending.
// The plan (one CTA of 1024 threads up to kMoePlanOneCtaMax assignments: counting, three
// block-wide scans, placement; above, three kernels over chunks of kMoePlanChunk) gives each
// assignment a slot inside its expert's segment by a shared-memory atomic, so the order of rows
// within a segment may differ between runs. The outputs do not: every output row is computed
// from its own x row alone (the GEMM's rows, the GEMV's tokens, never mix; each k split and
// each sum has a fixed order), and the combine reads each assignment's row through `pos` and
// sums a token's experts in ascending expert id, as the CPU twin does. So the layer is bit for
// bit deterministic; only the scratch's row order varies.
// x is never copied into the permuted order: the gate_up kernels read x rows through
// row_token (GEMM) or i / k (GEMV). act (gate_up's output) and y (down's) share one row order,
// so down reads act rows contiguously. y is bf16 [T·k, hidden] (the CPU twin keeps it in
// float32; one bf16 rounding of each expert output, ~2^-9 relative, then a float32 weighted sum).
// Regime: decode (launch_moe_gemv) while the rows per expert T·k / E stay small: every touched
// expert's weights streamed once per pass of up to 32 rows; prefill (launch_moe_gemm) beyond.
// INT4 experts at decode take the register GEMV's experts modes instead where the tunables say
// (moe_experts_int4_reg.cu).
#include <algorithm>
#include <cmath>

#include "backend/cuda/moe_experts.cuh"
#include "backend/cuda/moe_experts_int4_reg.h"

namespace strata::cuda {
namespace {

using namespace moe;

constexpr int kPlanThreads = 1024;

// Exclusive prefix sum over the CTA (thread order) of v; the total in *total. All threads call
// it; `sums` is 32 ints of shared memory.
__device__ __forceinline__ int block_exclusive_scan(int v, int* total, int* sums) {
  const int lane = int(threadIdx.x) % 32, warp = int(threadIdx.x) / 32;
  int inc = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int n = __shfl_up_sync(0xffffffffu, inc, o);
    if (lane >= o) inc += n;
  }
  if (lane == 31) sums[warp] = inc;
  __syncthreads();
  if (warp == 0) {
    int s = sums[lane];
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int n = __shfl_up_sync(0xffffffffu, s, o);
      if (lane >= o) s += n;
    }
    sums[lane] = s;  // inclusive over warps
  }
  __syncthreads();
  *total = sums[31];
  return (warp > 0 ? sums[warp - 1] : 0) + inc - v;
}

// Offsets, the active list, the tile list and the counts from each expert's row count n
// (thread t is expert t; every thread of the kPlanThreads calls it). Returns expert tid's first
// row.
__device__ __forceinline__ int plan_segments(const MoePlanParams& p, int n, int (*sums)[32]) {
  const int tid = int(threadIdx.x), experts = p.num_experts;
  const MoePlan& plan = p.plan;
  const int tiles = p.tile_rows > 0 ? (n + p.tile_rows - 1) / p.tile_rows : 0;
  int rows_total, active_total, tiles_total;
  const int first_row = block_exclusive_scan(n, &rows_total, sums[0]);
  const int slot = block_exclusive_scan(n > 0 ? 1 : 0, &active_total, sums[1]);
  const int first_tile = block_exclusive_scan(tiles, &tiles_total, sums[2]);
  if (tid < experts) {
    plan.offsets[tid] = first_row;
    if (n > 0) plan.active[slot] = tid;
    for (int q = 0; q < tiles; ++q) {
      plan.tiles[2 * (first_tile + q)] = tid;
      plan.tiles[2 * (first_tile + q) + 1] = first_row + q * p.tile_rows;
    }
  }
  if (tid == 0) {
    plan.offsets[experts] = rows_total;
    plan.counts[0] = active_total;
    plan.counts[1] = tiles_total;
  }
  return first_row;
}

// The plan in one CTA (up to kMoePlanOneCtaMax assignments).
__global__ void __launch_bounds__(kPlanThreads, 1) moe_plan_kernel(MoePlanParams p) {
  __shared__ int count[kMoeMaxExperts];
  __shared__ int base[kMoeMaxExperts];
  __shared__ int sums[3][32];
  pdl_enter(p.pdl_early);
  const int tid = int(threadIdx.x), experts = p.num_experts;
  if (tid < experts) count[tid] = 0;
  __syncthreads();
  const MoePlan& plan = p.plan;
  // Slots: each assignment's index within its expert's rows.
  for (int64_t i = tid; i < p.assignments; i += kPlanThreads) {
    const int e = p.topk_ids[i];
    plan.pos[i] = e >= 0 && e < experts ? atomicAdd(&count[e], 1) : -1;
  }
  __syncthreads();
  const int first_row = plan_segments(p, tid < experts ? count[tid] : 0, sums);
  if (tid < experts) base[tid] = first_row;
  __syncthreads();
  // Permuted rows: pos = segment start + slot, and each row's token.
  for (int64_t i = tid; i < p.assignments; i += kPlanThreads) {
    const int slot = plan.pos[i];
    if (slot < 0) continue;
    const int r = base[p.topk_ids[i]] + slot;
    plan.pos[i] = r;
    plan.row_token[r] = int(i / p.top_k);
  }
}

// The plan over many CTAs (more than kMoePlanOneCtaMax assignments; the one CTA's loops of
// dependent loads took 85 us at 65,536): (1) CTA b counts its chunk of kPlanChunk assignments
// per expert (slots by shared-memory atomics, as above) into block_counts[b][e]; (2) one CTA
// turns each expert's column of counts into exclusive prefixes over b and its total, then the
// segments as above; (3) CTA b places its chunk: pos = offsets[e] + block_counts[b][e] + slot.
constexpr int kPlanChunkThreads = 512;
__global__ void __launch_bounds__(kPlanChunkThreads) moe_plan_count_kernel(MoePlanParams p) {
  __shared__ int count[kMoeMaxExperts];
  pdl_enter(p.pdl_early);
  const int tid = int(threadIdx.x), experts = p.num_experts;
  for (int e = tid; e < experts; e += kPlanChunkThreads) count[e] = 0;
  __syncthreads();
  const int64_t i0 = int64_t(blockIdx.x) * kMoePlanChunk;
  constexpr int kPer = kMoePlanChunk / kPlanChunkThreads;
  int ids[kPer];
#pragma unroll
  for (int u = 0; u < kPer; ++u) {
    const int64_t i = i0 + tid + u * kPlanChunkThreads;
    ids[u] = i < p.assignments ? p.topk_ids[i] : -1;
  }
#pragma unroll
  for (int u = 0; u < kPer; ++u) {
    const int64_t i = i0 + tid + u * kPlanChunkThreads;
    if (i < p.assignments)
      p.plan.pos[i] = ids[u] >= 0 && ids[u] < experts ? atomicAdd(&count[ids[u]], 1) : -1;
  }
  __syncthreads();
  for (int e = tid; e < experts; e += kPlanChunkThreads)
    p.plan.block_counts[int64_t(blockIdx.x) * experts + e] = count[e];
}

__global__ void __launch_bounds__(kPlanThreads, 1)
    moe_plan_scan_kernel(MoePlanParams p, int blocks) {
  __shared__ int sums[3][32];
  pdl_enter(0);
  const int tid = int(threadIdx.x), experts = p.num_experts;
  int run = 0;
  if (tid < experts) {
    int32_t* col = p.plan.block_counts + tid;
    int b = 0;
    for (; b + 4 <= blocks; b += 4) {  // four loads in flight
      int h[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) h[u] = col[int64_t(b + u) * experts];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        col[int64_t(b + u) * experts] = run;
        run += h[u];
      }
    }
    for (; b < blocks; ++b) {
      const int h = col[int64_t(b) * experts];
      col[int64_t(b) * experts] = run;
      run += h;
    }
  }
  plan_segments(p, run, sums);
}

__global__ void __launch_bounds__(kPlanChunkThreads) moe_plan_place_kernel(MoePlanParams p) {
  pdl_enter(0);
  const int tid = int(threadIdx.x), experts = p.num_experts;
  const int64_t i0 = int64_t(blockIdx.x) * kMoePlanChunk;
  const int32_t* before = p.plan.block_counts + int64_t(blockIdx.x) * experts;
  for (int u = 0; u < kMoePlanChunk / kPlanChunkThreads; ++u) {
    const int64_t i = i0 + tid + u * kPlanChunkThreads;
    if (i >= p.assignments) break;
    const int slot = p.plan.pos[i];
    if (slot < 0) continue;
    const int e = p.topk_ids[i];
    const int r = p.plan.offsets[e] + before[e] + slot;
    p.plan.pos[i] = r;
    p.plan.row_token[r] = int(i / p.top_k);
  }
}

// One thread per 16-byte lane piece of a tile: gathers its elements from the row-major source
// (or, unpacking, scatters them back to it).
__global__ void moe_repack_kernel(MoeRepackParams p) {
  const int64_t kt_count = moe_k_tiles(p.format, p.k);
  const int64_t pieces = p.rows / kMoeTileRows * kt_count * 32;
  const int tk = moe_tile_k(p.format);
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < pieces;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int lane = int(i % 32);
    const int64_t tile = i / 32, rt = tile / kt_count, kt = tile % kt_count;
    uint32_t w[4] = {0, 0, 0, 0};
    if (p.unpack) {
      const uint4 v = reinterpret_cast<const uint4*>(p.src)[i];
      w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
    }
    if (p.format == kMoeBf16) {
      const bf16_bits* src = static_cast<const bf16_bits*>(p.src);
      for (int e = 0; e < 8; ++e) {
        int row, col;
        bf16_tile_coords(lane, e, &row, &col);
        const int64_t r = rt * kMoeTileRows + row, c = kt * tk + col;
        if (p.unpack) {
          if (c < p.k)
            static_cast<bf16_bits*>(p.dst)[r * p.k + c] = bf16_bits(w[e / 2] >> (16 * (e % 2)));
          continue;
        }
        const uint32_t v = c < p.k ? src[r * p.k + c] : 0u;
        w[e / 2] |= v << (16 * (e % 2));
      }
    } else {
      const uint8_t* src = static_cast<const uint8_t*>(p.src);
      for (int e = 0; e < 16; ++e) {
        int row, col;
        fp8_tile_coords(lane, e, &row, &col);
        const int64_t r = rt * kMoeTileRows + row, c = kt * tk + col;
        if (p.unpack) {
          if (c < p.k)
            static_cast<uint8_t*>(p.dst)[r * p.k + c] = uint8_t(w[e / 4] >> (8 * (e % 4)));
          continue;
        }
        const uint32_t v = c < p.k ? src[r * p.k + c] : 0u;
        w[e / 4] |= v << (8 * (e % 4));
      }
    }
    if (!p.unpack) reinterpret_cast<uint4*>(p.dst)[i] = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

size_t align256(size_t v) { return (v + 255) / 256 * 256; }

// The scratch of one step, carved in a fixed order (moe_experts_scratch_bytes sums the same).
struct Scratch {
  MoePlan plan;
  bf16_bits* act;
  bf16_bits* y;
  // x and act staged in f16 for the FP8 GEMV (MoeExpertsParams::fp8_f16), up to
  // kMoeStageF16MaxTokens tokens; else null.
  uint16_t* x16;
  float* x_inv;
  uint16_t* act16;
  float* act_inv;
  size_t bytes;
};
Scratch carve(void* base, int64_t tokens, int top_k, int experts, int64_t hidden, int64_t inter) {
  const int64_t n = tokens * top_k;
  char* at = static_cast<char*>(base);
  size_t used = 0;
  auto take = [&](size_t bytes) {
    char* p = at ? at + used : nullptr;
    used += align256(bytes);
    return p;
  };
  Scratch s;
  s.plan.offsets = reinterpret_cast<int32_t*>(take(size_t(experts + 1) * 4));
  s.plan.pos = reinterpret_cast<int32_t*>(take(size_t(n) * 4));
  s.plan.row_token = reinterpret_cast<int32_t*>(take(size_t(n) * 4));
  s.plan.active = reinterpret_cast<int32_t*>(take(size_t(experts) * 4));
  s.plan.counts = reinterpret_cast<int32_t*>(take(2 * 4));
  // Tiles of the smallest rows any plan asks for: the register GEMV's 4-row tiles.
  s.plan.tiles = reinterpret_cast<int32_t*>(take(size_t(moe_max_tiles(n, experts, 4)) * 8));
  s.plan.block_counts =
      reinterpret_cast<int32_t*>(take(size_t(moe_plan_blocks(n)) * size_t(experts) * 4));
  s.act = reinterpret_cast<bf16_bits*>(take(size_t(n * inter) * 2));
  s.y = reinterpret_cast<bf16_bits*>(take(size_t(n * hidden) * 2));
  s.x16 = s.act16 = nullptr;
  s.x_inv = s.act_inv = nullptr;
  if (tokens <= kMoeStageF16MaxTokens) {
    s.x16 = reinterpret_cast<uint16_t*>(take(size_t(tokens * hidden) * 2));
    s.x_inv = reinterpret_cast<float*>(take(size_t(tokens) * 4));
    s.act16 = reinterpret_cast<uint16_t*>(take(size_t(n * inter) * 2));
    s.act_inv = reinterpret_cast<float*>(take(size_t(n) * 4));
  }
  s.bytes = used;
  return s;
}

}  // namespace

int64_t moe_values_bytes(int format, int64_t n, int64_t k) {
  return n / kMoeTileRows * moe_k_tiles(format, k) * kMoeTileBytes;
}

int64_t moe_scale_bytes(int format, int64_t n, int64_t k, int group) {
  if (format == kMoeInt4) return int4_scale_bytes(n, k, group);
  if (format == kMoeFp8) return ceil_div(n, kMoeFp8Block) * ceil_div(k, kMoeFp8Block) * 4;
  return 0;
}

bool moe_weight_shape_ok(int format, int64_t n, int64_t k, int group, const char** why) {
  const char* w = nullptr;
  if (format != kMoeBf16 && format != kMoeFp8 && format != kMoeInt4)
    w = "unknown weight format";
  else if (n <= 0 || k <= 0 || n % kMoeTileRows != 0)
    w = "n must be a positive multiple of 16";
  else if (k % 16 != 0)
    w = "k must be a multiple of 16";
  else if (format == kMoeInt4 && (!int4_group_supported(group) || k % group != 0))
    w = "int4: the group must be a power of two >= 32 dividing k";
  if (why) *why = w;
  return w == nullptr;
}

void launch_moe_repack(const MoeRepackParams& p, cudaStream_t stream) {
  CHECK_MSG(p.format == kMoeBf16 || p.format == kMoeFp8,
            "moe repack: format {} (int4: "
            "launch_int4_repack)",
            p.format);
  CHECK_MSG(p.rows % kMoeTileRows == 0 && p.k % 16 == 0, "moe repack: rows {} k {}", p.rows, p.k);
  CHECK(uintptr_t(p.unpack ? p.src : p.dst) % 16 == 0);
  const int64_t work = p.rows / kMoeTileRows * moe_k_tiles(p.format, p.k) * 32;
  if (work == 0) return;
  const int blocks = int(std::min<int64_t>(ceil_div(work, 256), int64_t(num_sms()) * 16));
  moe_repack_kernel<<<blocks, 256, 0, stream>>>(p);
  CUDA_LAUNCH_CHECK();
}

void launch_moe_plan(const MoePlanParams& p, cudaStream_t stream) {
  CHECK_MSG(p.num_experts > 0 && p.num_experts <= kMoeMaxExperts, "moe plan: {} experts (max {})",
            p.num_experts, kMoeMaxExperts);
  CHECK(p.top_k > 0 && p.tile_rows >= 0);
  CHECK_MSG(p.assignments < (int64_t(1) << 31), "moe plan: {} assignments", p.assignments);
  const int64_t blocks = moe_plan_blocks(p.assignments);
  if (blocks == 0) {
    launch_pdl(moe_plan_kernel, dim3(1), dim3(kPlanThreads), 0, Launch{stream}, p);
  } else {
    CHECK_MSG(p.plan.block_counts != nullptr, "moe plan: {} assignments need block_counts",
              p.assignments);
    launch_pdl(moe_plan_count_kernel, dim3(unsigned(blocks)), dim3(kPlanChunkThreads), 0,
               Launch{stream}, p);
    launch_pdl(moe_plan_scan_kernel, dim3(1), dim3(kPlanThreads), 0, Launch{stream}, p,
               int(blocks));
    launch_pdl(moe_plan_place_kernel, dim3(unsigned(blocks)), dim3(kPlanChunkThreads), 0,
               Launch{stream}, p);
  }
  CUDA_LAUNCH_CHECK();
}

int moe_pick_regime(int64_t tokens, int top_k, int num_experts) {
  return tokens * top_k <= int64_t(kMoeDecodeRowsPerExpert) * num_experts ? kMoeDecode
                                                                          : kMoePrefill;
}

// gate_up dequantizes each weight once per tile, so 128-row tiles pay once experts are full
// enough: moe_bench --what kernels --tile-rows 64|128, H200, 2026-12-04 (gate_up us, 64 / 128):
// DeepSeek-V3 rank (FP8) averaging 32 / 64 / 128 rows 409 / 492, 593 / 558, 991 / 832; Kimi-K2.5
// rank (INT4) 21 / 43 / 85 rows 466 / 644, 508 / 657, 958 / 748; Moonlight (bf16) 96 rows 319 /
// 290. (The threshold was 192 before.)
int moe_gemm_tile_rows(int64_t tokens, int top_k, int num_experts) {
  return tokens * top_k >= int64_t(64) * num_experts ? 128 : 64;
}

int moe_gemv_tokens(int64_t tokens, int top_k, int num_experts) {
  const int64_t n = tokens * top_k;
  const int64_t rows = n <= 2 * int64_t(num_experts) ? 8 : n <= 4 * int64_t(num_experts) ? 16 : 32;
  return int(std::min<int64_t>(rows, tokens));
}

size_t moe_experts_scratch_bytes(int64_t tokens, int top_k, int num_experts, int64_t hidden,
                                 int64_t inter) {
  return carve(nullptr, tokens, top_k, num_experts, hidden, inter).bytes;
}

double moe_expected_active(int64_t tokens, int top_k, int num_experts) {
  const double e = num_experts, n = double(tokens) * top_k;
  return std::min({e, n, e * (1.0 - std::pow(1.0 - double(top_k) / e, double(tokens)))});
}

void launch_moe_experts(const MoeExpertsParams& p, cudaStream_t stream) {
  if (p.tokens == 0) return;
  const int64_t hidden = p.down.n, inter = p.down.k, n = p.tokens * p.top_k;
  CHECK_MSG(p.gate_up.n == 2 * inter && p.gate_up.k == hidden,
            "moe experts: gate_up [{}, {}] for hidden {} inter {}", p.gate_up.n, p.gate_up.k,
            hidden, inter);
  CHECK(uintptr_t(p.scratch) % 256 == 0);
  const Scratch s = carve(p.scratch, p.tokens, p.top_k, p.num_experts, hidden, inter);
  const int regime =
      p.regime != kMoeAuto ? p.regime : moe_pick_regime(p.tokens, p.top_k, p.num_experts);
  const bool decode = regime != kMoePrefill;
  const int tile_rows = p.fixed_tiles ? 64 : moe_gemm_tile_rows(p.tokens, p.top_k, p.num_experts);
  auto combine = [&](const int32_t* pos) {  // pos: null in assignment order
    MoeCombineParams comb{};
    comb.y = s.y;
    comb.pos = pos;
    comb.topk_ids = p.topk_ids;
    comb.topk_weights = p.topk_weights;
    comb.add = p.add;
    comb.out = p.out;
    comb.tokens = p.tokens;
    comb.hidden = hidden;
    comb.top_k = p.top_k;
    comb.num_experts = p.num_experts;
    comb.pdl_early = 0;
    comb.cluster_max_tokens = p.combine_cluster_max_tokens;
    comb.norm_out = p.norm_out;
    comb.norm_residual = p.norm_residual;
    comb.norm_w = p.norm_w;
    comb.norm_eps = p.norm_eps;
    comb.norm_w_f32 = p.norm_w_f32;
    if (p.join_event != nullptr) CUDA_CHECK(cudaStreamWaitEvent(stream, p.join_event, 0));
    launch_moe_combine(comb, stream);
  };
  const bool int4 = p.gate_up.format == kMoeInt4 && p.down.format == kMoeInt4;
  if (decode && int4 && p.int4_down_combine && launch_moe_int4_down_combined(p, s.act, stream))
    return;
  if (decode && int4 && n <= p.int4_reg_max_assignments &&
      launch_moe_int4_reg(p, s.act, s.y, stream))
    return combine(nullptr);
  if (decode && int4 && p.int4_reg_planned &&
      launch_moe_int4_reg_planned(p, s.plan, s.act, s.y, stream))
    return combine(s.plan.pos);

  MoeGroupedParams g{};
  g.pdl_early = p.pdl_early;
  if (decode) {  // no plan: the GEMV CTAs find their experts; rows in assignment order
    g.topk_ids = p.topk_ids;
    g.assignments = n;
    g.num_experts = p.num_experts;
    g.max_active = int(std::min<int64_t>(p.num_experts, n));
    g.expect_active = int(std::ceil(moe_expected_active(p.tokens, p.top_k, p.num_experts)));
    g.gemv_tokens = moe_gemv_tokens(p.tokens, p.top_k, p.num_experts);
  } else {
    MoePlanParams plan{};
    plan.topk_ids = p.topk_ids;
    plan.plan = s.plan;
    plan.assignments = n;
    plan.top_k = p.top_k;
    plan.num_experts = p.num_experts;
    plan.tile_rows = tile_rows;
    plan.pdl_early = p.pdl_early;
    launch_moe_plan(plan, stream);
    g.offsets = s.plan.offsets;
    g.tiles = s.plan.tiles;
    g.counts = s.plan.counts;
    g.max_tiles = int(moe_max_tiles(n, p.num_experts, tile_rows));
    g.tile_rows = tile_rows;
    g.num_experts = p.num_experts;
    if (p.fixed_tiles) g.gemm_blocks = -1;  // the one-block pipeline (not sized by the grid)
  }
  auto run = [&](const MoeGroupedParams& q) {
    decode ? launch_moe_gemv(q, stream) : launch_moe_gemm(q, stream);
  };
  // FP8 GEMVs against x in f16 (fp8_f16; the scratch holds the staged rows only up to
  // kMoeStageF16MaxTokens): each projection's x staged first, one small launch each.
  const bool f16 = decode && p.fp8_f16 && p.tokens <= kMoeStageF16MaxTokens;
  auto stage = [&](MoeGroupedParams& q, uint16_t* x16, float* inv) {
    if (!f16 || q.w.format != kMoeFp8 || q.w.k % 32 != 0) return;
    // Or no launch: the GEMV's CTAs stage the rows they read in shared memory (few tokens: each
    // CTA of a pass stages the pass's rows again, CudaTunables::moe_fp8_f16_smem_max_tokens).
    if (p.tokens <= p.fp8_f16_smem_max_tokens &&
        (q.stage_smem = moe_gemv_stage_smem(q)) != kMoeStageNone)
      return;
    MoeStageF16Params st{};
    st.x = q.x;
    st.x16 = x16;
    st.inv = inv;
    st.rows = q.rows;
    st.k = q.w.k;
    st.pdl_early = 0;
    launch_moe_stage_f16(st, stream);
    q.x_f16 = x16;
    q.x_inv = inv;
  };
  MoeGroupedParams gate_up = g;  // act = silu(x · Wgᵀ) · (x · Wuᵀ), x through the rows' tokens
  gate_up.x = p.x;
  gate_up.rows = p.tokens;
  gate_up.x_div = p.top_k;
  gate_up.row_token = decode ? nullptr : s.plan.row_token;
  gate_up.out = s.act;
  gate_up.w = p.gate_up;
  gate_up.glu_inter = inter;
  gate_up.pipe = !decode && !p.fixed_tiles ? p.gemm_pipe : 0;
  stage(gate_up, s.x16, s.x_inv);
  run(gate_up);
  MoeGroupedParams down = g;  // y = act · Wdᵀ, both in the same row order
  down.x = s.act;
  down.rows = n;
  down.x_div = 1;
  down.out = s.y;
  down.w = p.down;
  // topk_ids were complete before gate_up's pdl_wait returned, and gate_up (or act's f16 stage,
  // which waits on gate_up first) lets down launch only after that wait (unless gate_up
  // triggers early): down may plan before its own wait.
  down.early_plan = gate_up.pdl_early ? 0 : 1;
  down.weight_stationary = !decode && !p.fixed_tiles && p.gemm_weight_stationary ? 1 : 0;
  down.pipe = gate_up.pipe;
  down.narrow_tails = p.gemm_narrow_tails;
  down.pdl_early = 0;
  stage(down, s.act16, s.act_inv);
  run(down);
  combine(decode ? nullptr : s.plan.pos);
}

}  // namespace strata::cuda
