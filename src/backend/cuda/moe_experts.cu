// MoE experts on the GPU: the plan, the combine, the weight repack and the step that strings
// them together with the grouped GEMMs (moe_experts_gemv.cu, moe_experts_gemm.cu).
//
// ## Design
// No host synchronization: the host knows T, k and E only, so every grid is sized by a bound
// (experts with rows <= min(E, T·k); GEMM tiles <= ceil(T·k / BM) + min(E, T·k)) and CTAs past
// the device's counts exit at once. A MoE step is then a fixed sequence of launches whose
// parameter bytes depend on T only: CUDA-graph capturable.
// The permuted order: expert e's rows are [offsets[e], offsets[e + 1]), experts ascending. The
// plan kernel (one CTA of 1024 threads: counting, three block-wide scans, placement) gives each
// assignment a slot inside its expert's segment by a shared-memory atomic, so the order of rows
// within a segment may differ between runs. The outputs do not: every output row is computed
// from its own x row alone (the GEMM's rows, the GEMV's tokens, never mix; each k split and
// each sum has a fixed order), and the combine reads each assignment's row through `pos` and
// sums a token's experts in ascending expert id, as the CPU twin does. So the layer is bit for
// bit deterministic; only the scratch's row order varies.
// x is never copied into the permuted order: the gate_up kernels read x rows through
// row_token. act (gate_up's output) and y (down's) are in the permuted order, so down reads act
// rows contiguously. y is bf16 [T·k, hidden] (the CPU twin keeps it in float32; one bf16
// rounding of each expert output, ~2^-9 relative, then a float32 weighted sum).
// Regime: decode (launch_moe_gemv) while the rows per expert T·k / E stay small: every touched
// expert's weights streamed once per pass of up to 32 rows; prefill (launch_moe_gemm) beyond.
#include <algorithm>

#include "backend/cuda/moe_experts.cuh"

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
  // Offsets, the active list and the tile list: thread t is expert t.
  const int n = tid < experts ? count[tid] : 0;
  const int tiles = p.tile_rows > 0 ? (n + p.tile_rows - 1) / p.tile_rows : 0;
  int rows_total, active_total, tiles_total;
  const int first_row = block_exclusive_scan(n, &rows_total, sums[0]);
  const int slot = block_exclusive_scan(n > 0 ? 1 : 0, &active_total, sums[1]);
  const int first_tile = block_exclusive_scan(tiles, &tiles_total, sums[2]);
  if (tid < experts) {
    base[tid] = first_row;
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

// One CTA per token: its k (expert, weight, row) sorted by expert id, then 8 columns per thread
// per pass, float32 sums in that order.
constexpr int kCombineThreads = 128;
__global__ void __launch_bounds__(kCombineThreads) moe_combine_kernel(MoeCombineParams p) {
  __shared__ int ids[kMoeMaxTopK];
  __shared__ int rows[kMoeMaxTopK];
  __shared__ float weights[kMoeMaxTopK];
  pdl_enter(p.pdl_early);
  const int64_t t = blockIdx.x;
  const int k = p.top_k;
  if (threadIdx.x == 0) {
    for (int j = 0; j < k; ++j) {  // insertion sort by (expert id, j)
      const int id = p.topk_ids[t * k + j], row = p.pos[t * k + j];
      const float w = p.topk_weights[t * k + j];
      int at = j;
      while (at > 0 && ids[at - 1] > id) {
        ids[at] = ids[at - 1];
        rows[at] = rows[at - 1];
        weights[at] = weights[at - 1];
        --at;
      }
      ids[at] = id;
      rows[at] = row;
      weights[at] = w;
    }
  }
  __syncthreads();
  for (int64_t v = threadIdx.x; v < p.hidden / 8; v += kCombineThreads) {
    float acc[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[i] = 0.0f;
    for (int j = 0; j < k; ++j) {
      if (rows[j] < 0) continue;  // an id outside [0, E): no expert
      float y[8];
      unpack8(__ldg(reinterpret_cast<const uint4*>(p.y + int64_t(rows[j]) * p.hidden) + v), y);
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[i] = __fadd_rn(acc[i], __fmul_rn(weights[j], y[i]));
    }
    if (p.add != nullptr) {
      float a[8];
      unpack8(__ldg(reinterpret_cast<const uint4*>(p.add + t * p.hidden) + v), a);
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[i] += a[i];
    }
    reinterpret_cast<uint4*>(p.out + t * p.hidden)[v] = pack8(acc);
  }
}

// One thread per 16-byte lane piece of a tile: gathers its elements from the row-major source.
__global__ void moe_repack_kernel(MoeRepackParams p) {
  const int64_t kt_count = moe_k_tiles(p.format, p.k);
  const int64_t pieces = p.rows / kMoeTileRows * kt_count * 32;
  const int tk = moe_tile_k(p.format);
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < pieces;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int lane = int(i % 32);
    const int64_t tile = i / 32, rt = tile / kt_count, kt = tile % kt_count;
    uint32_t w[4] = {0, 0, 0, 0};
    if (p.format == kMoeBf16) {
      const bf16_bits* src = static_cast<const bf16_bits*>(p.src);
      for (int e = 0; e < 8; ++e) {
        int row, col;
        bf16_tile_coords(lane, e, &row, &col);
        const int64_t r = rt * kMoeTileRows + row, c = kt * tk + col;
        const uint32_t v = c < p.k ? src[r * p.k + c] : 0u;
        w[e / 2] |= v << (16 * (e % 2));
      }
    } else {
      const uint8_t* src = static_cast<const uint8_t*>(p.src);
      for (int e = 0; e < 16; ++e) {
        int row, col;
        fp8_tile_coords(lane, e, &row, &col);
        const int64_t r = rt * kMoeTileRows + row, c = kt * tk + col;
        const uint32_t v = c < p.k ? src[r * p.k + c] : 0u;
        w[e / 4] |= v << (8 * (e % 4));
      }
    }
    reinterpret_cast<uint4*>(p.dst)[i] = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

int num_sms() {
  static const int sms = [] {
    int dev = 0, n = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    return n;
  }();
  return sms;
}

size_t align256(size_t v) { return (v + 255) / 256 * 256; }

// The scratch of one step, carved in a fixed order (moe_experts_scratch_bytes sums the same).
struct Scratch {
  MoePlan plan;
  bf16_bits* act;
  bf16_bits* y;
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
  s.plan.tiles = reinterpret_cast<int32_t*>(take(size_t(moe_max_tiles(n, experts, 64)) * 8));
  s.act = reinterpret_cast<bf16_bits*>(take(size_t(n * inter) * 2));
  s.y = reinterpret_cast<bf16_bits*>(take(size_t(n * hidden) * 2));
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
  CHECK(uintptr_t(p.dst) % 16 == 0);
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
  launch_pdl(moe_plan_kernel, dim3(1), dim3(kPlanThreads), 0, Launch{stream}, p);
  CUDA_LAUNCH_CHECK();
}

void launch_moe_combine(const MoeCombineParams& p, cudaStream_t stream) {
  if (p.tokens == 0) return;
  CHECK_MSG(p.top_k > 0 && p.top_k <= kMoeMaxTopK, "moe combine: top_k {}", p.top_k);
  CHECK(p.hidden % 8 == 0 && uintptr_t(p.y) % 16 == 0 && uintptr_t(p.out) % 16 == 0 &&
        uintptr_t(p.add) % 16 == 0);
  CHECK(p.tokens < (int64_t(1) << 31));
  launch_pdl(moe_combine_kernel, dim3(unsigned(p.tokens)), dim3(kCombineThreads), 0, Launch{stream}, p);
  CUDA_LAUNCH_CHECK();
}

int moe_pick_regime(int64_t tokens, int top_k, int num_experts) {
  return tokens * top_k <= int64_t(kMoeDecodeRowsPerExpert) * num_experts ? kMoeDecode
                                                                          : kMoePrefill;
}

int moe_gemm_tile_rows(int64_t tokens, int top_k, int num_experts) {
  return tokens * top_k >= int64_t(192) * num_experts ? 128 : 64;
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
  const int tile_rows = moe_gemm_tile_rows(p.tokens, p.top_k, p.num_experts);

  MoePlanParams plan{};
  plan.topk_ids = p.topk_ids;
  plan.plan = s.plan;
  plan.assignments = n;
  plan.top_k = p.top_k;
  plan.num_experts = p.num_experts;
  plan.tile_rows = regime == kMoePrefill ? tile_rows : 0;
  plan.pdl_early = p.pdl_early;
  launch_moe_plan(plan, stream);

  MoeGroupedParams g{};
  g.offsets = s.plan.offsets;
  g.active = s.plan.active;
  g.tiles = s.plan.tiles;
  g.counts = s.plan.counts;
  g.max_active = int(std::min<int64_t>(p.num_experts, n));
  g.max_tiles = int(moe_max_tiles(n, p.num_experts, tile_rows));
  g.tile_rows = tile_rows;
  g.gemv_tokens = moe_gemv_tokens(p.tokens, p.top_k, p.num_experts);
  g.pdl_early = p.pdl_early;
  auto run = [&](const MoeGroupedParams& q) {
    regime == kMoePrefill ? launch_moe_gemm(q, stream) : launch_moe_gemv(q, stream);
  };
  MoeGroupedParams gate_up = g;  // act = silu(x · Wgᵀ) · (x · Wuᵀ), x through row_token
  gate_up.x = p.x;
  gate_up.rows = p.tokens;
  gate_up.row_token = s.plan.row_token;
  gate_up.out = s.act;
  gate_up.w = p.gate_up;
  gate_up.glu_inter = inter;
  run(gate_up);
  MoeGroupedParams down = g;  // y = act · Wdᵀ, both in the permuted order
  down.x = s.act;
  down.rows = n;
  down.out = s.y;
  down.w = p.down;
  run(down);

  MoeCombineParams comb{};
  comb.y = s.y;
  comb.pos = s.plan.pos;
  comb.topk_ids = p.topk_ids;
  comb.topk_weights = p.topk_weights;
  comb.add = p.add;
  comb.out = p.out;
  comb.tokens = p.tokens;
  comb.hidden = hidden;
  comb.top_k = p.top_k;
  comb.pdl_early = p.pdl_early;
  launch_moe_combine(comb, stream);
}

}  // namespace strata::cuda
