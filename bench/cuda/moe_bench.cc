// One MoE layer on the GPU (backend/cuda/moe_route.h, moe_experts.h) at 1 .. 8,192 tokens:
//   kimi        one tp-8 rank of Kimi-K2.5: 384 experts, hidden 7168, inter slice 256, INT4
//               group 32, top-8, sigmoid + correction bias, no group limit, scaling 2.827; the
//               shared expert (slice 256) in bf16 (the checkpoint keeps shared experts bf16)
//   moonlight   Moonlight-16B-A3B at tp 1 (../shared/configs/moonlight-16b-a3b): 64 experts,
//   moonlight-int4  2048 -> 1408, top-6, sigmoid, scaling 2.446, 2 shared experts (one MLP of
//               2816); bf16, and W4A16 group 128 (shared experts in the same format)
//   dsv3        one tp-8 rank of DeepSeek-V3, FP8 128x128 blocks: 256 experts, 7168 -> 256, top-8,
//               sigmoid + bias, 8 groups keep 4 (top-2 sums), scaling 2.5; shared expert (256) FP8
// Ceilings measured in the same run: device-to-device copy bandwidth (2 GiB, read + write) and
// cuBLAS bf16 GEMM 8192³.
//
// Per token count, stage by stage (each a CUDA graph of `calls` back-to-back calls, median of
// `reps` replays, divided by `calls`): the router (this file's GEMV up to 32 tokens, cuBLAS
// bf16 x bf16 -> f32 above), the route kernel, the prefill plan, the expert
// GEMMs alone (gate_up + down, and each alone; decode: the GEMV CTAs plan themselves, prefill:
// plans computed beforehand) in each regime, the combine, the shared expert (MoE dense mode, and up
// to their row limits the engine's dense decode GEMVs on the same shapes), and the whole layer
// (shared expert, router, route, launch_moe_experts in the auto regime with the shared output
// added by the combine). Then, for decode token counts up to --sweep-max-tokens, every GEMV work
// shape (ksplit / cluster / tiles_per_warp) forced in turn for the four projections (routed
// gate_up and down, shared gate_up and down), the automatic one first: "auto 8/2/1 5.1 us 61%"
// is the shape, its time and its bandwidth as a share of copy. For prefill token counts with a
// short-k down projection (inter <= kMoeGemmShortK), the down GEMM on the x-resident path at each
// gemm_blocks ("auto 8" first; -1 is the one-block pipeline), then on the weight-stationary
// kernel (the product's default where supported, so the "experts prefill" rows time that). With
// --producer-warp 1, for every prefill token count, "producer warp": each projection on the
// two-CTA kernel (or the weight-stationary one, the default where it applies), on the
// producer-warp GEMM (moe_experts_gemm_pipe.cu, the default elsewhere), back to back ("-": not
// applicable).
// Bandwidth counts the bytes of the experts actually touched (distinct experts of each call's
// routing, downloaded once before timing): experts GB/s = touched expert bytes / expert-GEMM
// time; the layer's adds the router and shared weights. Compute: routed FLOPs
// 2 · T · k · 3 · hidden · inter over the expert-GEMM time against the cuBLAS rate.
// No weight is read from L2 twice in a row: two copies of every layer's weights alternate, and
// eight different hidden-state batches (uniform random; routing them through random gate
// weights gives near-uniform expert choice, as in a load-balanced trained model: every expert
// equally likely, distinct experts ~ E · (1 - (1 - k/E)^T)) rotate.
// Checks before timing: decode and prefill regimes agree on batch 0 (NMSE printed; both are
// compared with the CPU twin by tests/parity/moe_experts_parity_test.cc).
//
// --what backend (or kernels,backend): the same layer through the CUDA backend's ops, shapes
// and formats from ../shared/configs (moe_backend_layer.h; --backend-configs dsv3,moonlight,kimi).
//
// Usage: strata_bench_moe_bench [--what kernels] [--configs kimi,moonlight,moonlight-int4,dsv3]
//        [--backend-configs dsv3,moonlight,kimi] [--tokens 1,8,32,128,512,8192] [--calls 16]
//        [--reps 5] [--sweep 1] [--sweep-max-tokens 32] [--variants moe_unrounded,moe_split2]
//        [--tile-rows 64|128]  (kernels mode: the prefill tiles forced, else
//        moe_gemm_tile_rows) [--producer-warp 1]  (kernels mode: see above)
//        [--narrow-tails 0|1]  (kernels mode: CudaTunables::moe_gemm_narrow_tails forced)
// --variants (backend mode): each T's experts also under each named tunable change
// (tunable_variants.h), same weights and routing.
#include <cublas_v2.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "backend/cuda/elementwise.h"
#include "backend/cuda/launch.h"
#include "backend/cuda/linear.h"
#include "backend/cuda/linear_fp8.h"
#include "backend/cuda/linear_int4.h"
#include "backend/cuda/moe_experts.h"
#include "backend/cuda/moe_route.h"
#include "backend/cuda/tunables.h"
#include "bench_args.h"
#include "core/dtype.h"
#include "moe_backend_layer.h"
#include "moe_bench_common.h"

namespace strata {
namespace {

using cuda::bf16_bits;
using namespace moe_bench;

int g_tile_rows = 0;      // --tile-rows 64|128 (kernels mode): the prefill plan's tiles forced
int g_producer_warp = 0;  // --producer-warp 1 (kernels mode): the "producer warp" comparison
int g_narrow_tails = -1;  // --narrow-tails 0|1 (kernels mode): forced; -1 the product's

// Fills a device buffer by repeating a 64 MiB host pattern (weights: random values need not be
// unique, only never served from L2, which depends on addresses).
enum class Pattern { kBytes, kFp8, kBf16, kScaleBf16, kScaleF32 };
void fill(Dev& d, Pattern kind, float scale, cudaStream_t s) {
  const size_t chunk = std::min<size_t>(d.bytes(), size_t(64) << 20);
  std::vector<uint8_t> host(chunk);
  uint64_t st = uint64_t(kind) * 7919 + uint64_t(scale * 1e6f);
  for (size_t i = 0; i + 8 <= chunk; i += 8) {
    uint64_t r = splitmix(st);
    switch (kind) {
      case Pattern::kBytes:
        break;
      case Pattern::kFp8:  // e4m3 without NaN: the exponent's lowest bit cleared
        r &= 0xf7f7f7f7f7f7f7f7ull;
        break;
      case Pattern::kBf16:
      case Pattern::kScaleBf16:
        for (int j = 0; j < 4; ++j) {
          const float f = (float((r >> (16 * j)) & 0xffff) / 65535.0f * 2.0f - 1.0f) * scale;
          const uint16_t b =
              f32_to_bf16(kind == Pattern::kScaleBf16 ? std::fabs(f) + scale * 0.1f : f);
          std::memcpy(host.data() + i + 2 * j, &b, 2);
        }
        continue;
      case Pattern::kScaleF32:
        for (int j = 0; j < 2; ++j) {
          const float f = (float((r >> (32 * j)) & 0xffff) / 65535.0f + 0.5f) * scale;
          std::memcpy(host.data() + i + 4 * j, &f, 4);
        }
        continue;
    }
    std::memcpy(host.data() + i, &r, 8);
  }
  Dev staging(chunk);
  CUDA_CHECK(cudaMemcpy(staging.as<void>(), host.data(), chunk, cudaMemcpyHostToDevice));
  for (size_t at = 0; at < d.bytes(); at += chunk)
    CUDA_CHECK(cudaMemcpyAsync(d.as<char>() + at, staging.as<void>(),
                               std::min(chunk, d.bytes() - at), cudaMemcpyDeviceToDevice, s));
  CUDA_CHECK(cudaStreamSynchronize(s));
}

struct Config {
  std::string name;
  int experts, top_k;
  int64_t hidden, inter;
  int format, group;  // cuda::MoeWeightFormat
  int groups, topk_groups, group_score;
  float scaling;
  int64_t shared_inter;
  int shared_format, shared_group;
};
const Config kConfigs[] = {
    {"kimi", 384, 8, 7168, 256, cuda::kMoeInt4, 32, 1, 1, cuda::kMoeGroupTop2Sum, 2.827f, 256,
     cuda::kMoeBf16, 0},
    {"moonlight", 64, 6, 2048, 1408, cuda::kMoeBf16, 0, 1, 1, cuda::kMoeGroupTop2Sum, 2.446f, 2816,
     cuda::kMoeBf16, 0},
    {"moonlight-int4", 64, 6, 2048, 1408, cuda::kMoeInt4, 128, 1, 1, cuda::kMoeGroupTop2Sum, 2.446f,
     2816, cuda::kMoeInt4, 128},
    {"dsv3", 256, 8, 7168, 256, cuda::kMoeFp8, 0, 8, 4, cuda::kMoeGroupTop2Sum, 2.5f, 256,
     cuda::kMoeFp8, 0},
};

// One projection of `experts` experts on the device, random.
struct Proj {
  DevPtr values, scales;
  cuda::MoeWeights w{};
  int64_t bytes_per_expert = 0;
};
Proj make_proj(int experts, int64_t n, int64_t k, int format, int group, cudaStream_t s) {
  Proj p;
  cuda::MoeWeights& w = p.w;
  w.n = n;
  w.k = k;
  w.format = format;
  w.group = group;
  w.values_stride = cuda::moe_values_bytes(format, n, k);
  w.scales_stride = cuda::moe_scale_bytes(format, n, k, group);
  p.bytes_per_expert = w.values_stride + w.scales_stride;
  p.values = dev(size_t(w.values_stride * experts));
  const float rms = 0.02f;  // weights of y = x · Wᵀ: x uniform [-1, 1], y of order 1
  if (format == cuda::kMoeBf16) {
    fill(*p.values, Pattern::kBf16, rms * 1.7f, s);
  } else if (format == cuda::kMoeInt4) {
    fill(*p.values, Pattern::kBytes, 0, s);
    p.scales = dev(size_t(w.scales_stride * experts));
    fill(*p.scales, Pattern::kScaleBf16, rms / 4.6f, s);
  } else {
    fill(*p.values, Pattern::kFp8, 0, s);
    p.scales = dev(size_t(w.scales_stride * experts));
    fill(*p.scales, Pattern::kScaleF32, rms / 50.0f, s);
  }
  w.values = p.values->as<void>();
  w.scales = p.scales ? p.scales->as<void>() : nullptr;
  return p;
}

struct Layer {
  Proj gate_up, down;
};

constexpr int kBatches = 8;  // different hidden-state batches per token count
constexpr int kCopies = 2;   // copies of the layer's weights

// The plan arrays of one batch (MoePlan; prefill).
struct PlanBufs {
  DevPtr offsets, pos, row_token, active, counts, tiles, block_counts;
  cuda::MoePlan plan{};
};
PlanBufs make_plan_bufs(int64_t n, int experts) {
  PlanBufs b;
  b.offsets = dev(size_t(experts + 1) * 4);
  b.pos = dev(size_t(n) * 4);
  b.row_token = dev(size_t(n) * 4);
  b.active = dev(size_t(experts) * 4);
  b.counts = dev(8);
  b.tiles = dev(size_t(cuda::moe_max_tiles(n, experts, 64)) * 8);
  b.block_counts = dev(size_t(cuda::moe_plan_blocks(n) * experts) * 4);
  b.plan = {b.offsets->as<int32_t>(),     b.pos->as<int32_t>(),    b.row_token->as<int32_t>(),
            b.active->as<int32_t>(),      b.counts->as<int32_t>(), b.tiles->as<int32_t>(),
            b.block_counts->as<int32_t>()};
  return b;
}

// The GEMV shapes the sweep tries besides the automatic one (ksplit / cluster / tiles_per_warp);
// those that do not fit a projection are skipped.
const cuda::MoeGemvShape kSweepShapes[] = {{1, 1, 1}, {1, 1, 2}, {1, 1, 4}, {1, 1, 8}, {2, 1, 1},
                                           {4, 1, 1}, {8, 1, 1}, {8, 2, 1}, {8, 4, 1}, {8, 8, 1}};

double nmse_bf16(const Dev& a, const Dev& b, size_t count) {
  std::vector<uint16_t> x(count), y(count);
  CUDA_CHECK(cudaMemcpy(x.data(), a.as<void>(), count * 2, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(y.data(), b.as<void>(), count * 2, cudaMemcpyDeviceToHost));
  double num = 0, den = 0;
  for (size_t i = 0; i < count; ++i) {
    const double u = bf16_to_f32(x[i]), v = bf16_to_f32(y[i]);
    if (!std::isfinite(u) || !std::isfinite(v)) return INFINITY;
    num += (u - v) * (u - v);
    den += v * v;
  }
  return den > 0 ? num / den : num;
}

void run_config(const Config& c, const std::vector<int>& token_counts, int calls, int reps,
                bool sweep, int sweep_max_tokens, const Ceilings& ceil, cudaStream_t s,
                cublasHandle_t h) {
  const int64_t H = c.hidden, I = c.inter;
  const int E = c.experts, K = c.top_k;
  std::vector<Layer> layers;
  for (int i = 0; i < kCopies; ++i) {
    Layer l;
    l.gate_up = make_proj(E, 2 * I, H, c.format, c.group, s);
    l.down = make_proj(E, H, I, c.format, c.group, s);
    layers.push_back(std::move(l));
  }
  std::vector<Layer> shared;
  for (int i = 0; i < kCopies; ++i) {
    Layer l;
    l.gate_up = make_proj(1, 2 * c.shared_inter, H, c.shared_format, c.shared_group, s);
    l.down = make_proj(1, H, c.shared_inter, c.shared_format, c.shared_group, s);
    shared.push_back(std::move(l));
  }
  // The shared expert as the engine's dense linears hold it (bf16 and fp8 row-major, fp8 scale
  // tables [ceil(n / 128), ceil(k / 128)]; int4: the same device layout as the MoE tiles), for
  // the comparison with the engine's decode GEMVs (launch_gemv / launch_fp8_gemv /
  // launch_int4_gemv).
  struct LinearShared {
    DevPtr gu, gu_scale, dn, dn_scale;
  };
  std::vector<LinearShared> shared_lin;
  for (int i = 0; i < kCopies; ++i) {
    LinearShared l;
    const int64_t SI = c.shared_inter;
    if (c.shared_format == cuda::kMoeBf16) {
      l.gu = dev(size_t(2 * SI * H) * 2);
      l.dn = dev(size_t(H * SI) * 2);
      fill(*l.gu, Pattern::kBf16, 0.02f * 1.7f, s);
      fill(*l.dn, Pattern::kBf16, 0.02f * 1.7f, s);
    } else if (c.shared_format == cuda::kMoeFp8) {
      l.gu = dev(size_t(2 * SI * H));
      l.dn = dev(size_t(H * SI));
      fill(*l.gu, Pattern::kFp8, 0, s);
      fill(*l.dn, Pattern::kFp8, 0, s);
      l.gu_scale = dev(size_t(ceil_div_i64(2 * SI, 128) * ceil_div_i64(H, 128)) * 4);
      l.dn_scale = dev(size_t(ceil_div_i64(H, 128) * ceil_div_i64(SI, 128)) * 4);
      fill(*l.gu_scale, Pattern::kScaleF32, 0.02f / 50.0f, s);
      fill(*l.dn_scale, Pattern::kScaleF32, 0.02f / 50.0f, s);
    }
    shared_lin.push_back(std::move(l));
  }
  const int64_t expert_bytes = layers[0].gate_up.bytes_per_expert + layers[0].down.bytes_per_expert;
  const int64_t shared_bytes = shared[0].gate_up.bytes_per_expert + shared[0].down.bytes_per_expert;
  const int64_t router_bytes = int64_t(E) * H * 2;
  std::vector<DevPtr> gates;
  for (int i = 0; i < kCopies; ++i) {
    gates.push_back(dev(size_t(router_bytes)));
    fill(*gates.back(), Pattern::kBf16, 0.02f * 1.7f, s);
  }
  std::vector<float> bias_h(static_cast<size_t>(E));
  {
    uint64_t st = 99;
    for (float& b : bias_h) b = (float(splitmix(st) % 20001) / 10000.0f - 1.0f) * 0.01f;
  }
  Dev bias(size_t(E) * 4);
  CUDA_CHECK(cudaMemcpy(bias.as<void>(), bias_h.data(), bias_h.size() * 4, cudaMemcpyHostToDevice));
  Dev counters(cuda::moe_router_counter_bytes(E));
  CUDA_CHECK(cudaMemset(counters.as<void>(), 0, counters.bytes()));
  std::printf(
      "\nconfig %s: E %d, top-%d, hidden %lld, inter %lld, %s; %.2f MB per expert; shared "
      "%lld (%.2f MB); router %.2f MB\n",
      c.name.c_str(), E, K, static_cast<long long>(H), static_cast<long long>(I),
      c.format == cuda::kMoeInt4  ? (c.group == 32 ? "int4 g32" : "int4 g128")
      : c.format == cuda::kMoeFp8 ? "fp8 128x128"
                                  : "bf16",
      expert_bytes / 1e6, static_cast<long long>(c.shared_inter), shared_bytes / 1e6,
      router_bytes / 1e6);

  for (int T : token_counts) {
    const int64_t n = int64_t(T) * K;
    // Inputs and their routing.
    std::vector<DevPtr> xs, logits, ids, wts;
    for (int b = 0; b < kBatches; ++b) {
      xs.push_back(dev(size_t(T) * H * 2));
      cuda::launch_fill_random_bf16(xs.back()->as<bf16_bits>(), T * H, 1000 + b, 1.0f, s);
      logits.push_back(dev(size_t(T) * E * 4));
      ids.push_back(dev(size_t(n) * 4));
      wts.push_back(dev(size_t(n) * 4));
    }
    Dev partials(std::max<size_t>(16, cuda::moe_router_partials_bytes(std::min(T, 32), E, H)));
    const float one = 1.0f, zero = 0.0f;
    auto router_params = [&](int b, int copy) {
      cuda::MoeRouterParams p{};
      p.x = xs[size_t(b)]->as<bf16_bits>();
      p.w = gates[size_t(copy)]->as<bf16_bits>();
      p.out = logits[size_t(b)]->as<float>();
      p.partials = partials.as<float>();
      p.counters = counters.as<int32_t>();
      p.tokens = T;
      p.experts = E;
      p.hidden = H;
      return p;
    };
    auto router = [&](int b, int copy) {
      if (T <= cuda::kMoeRouterMaxTokens) {
        cuda::launch_moe_router(router_params(b, copy), s);
      } else {
        CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, E, T, int(H), &one,
                           gates[size_t(copy)]->as<void>(), CUDA_R_16BF, int(H),
                           xs[size_t(b)]->as<void>(), CUDA_R_16BF, int(H), &zero,
                           logits[size_t(b)]->as<void>(), CUDA_R_32F, E, CUBLAS_COMPUTE_32F,
                           CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
      }
    };
    auto route_params = [&](int b) {
      cuda::MoeRouteParams p{};
      p.logits = logits[size_t(b)]->as<float>();
      p.bias = bias.as<float>();
      p.topk_ids = ids[size_t(b)]->as<int32_t>();
      p.topk_weights = wts[size_t(b)]->as<float>();
      p.tokens = T;
      p.num_experts = E;
      p.top_k = K;
      p.num_groups = c.groups;
      p.topk_groups = c.topk_groups;
      p.scoring = cuda::kMoeSigmoid;
      p.group_score = c.group_score;
      p.normalize = 1;
      p.scaling_factor = c.scaling;
      return p;
    };
    auto route = [&](int b) { cuda::launch_moe_route(route_params(b), s); };
    // Route every batch once (copy 0's gate) and count the distinct experts it touches.
    double touched = 0;
    for (int b = 0; b < kBatches; ++b) {
      router(b, 0);
      route(b);
      std::vector<int32_t> h_ids(static_cast<size_t>(n));
      CUDA_CHECK(cudaStreamSynchronize(s));
      CUDA_CHECK(cudaMemcpy(h_ids.data(), ids[size_t(b)]->as<void>(), size_t(n) * 4,
                            cudaMemcpyDeviceToHost));
      touched += double(std::set<int32_t>(h_ids.begin(), h_ids.end()).size()) / kBatches;
    }
    const double touched_bytes = touched * double(expert_bytes);
    const double flops = 2.0 * double(n) * 3.0 * double(H) * double(I);

    // Prefill plans per batch (decode needs none: the GEMV CTAs plan themselves); act and y.
    const int tile_rows = g_tile_rows ? g_tile_rows : cuda::moe_gemm_tile_rows(T, K, E);
    std::vector<PlanBufs> plans;
    for (int b = 0; b < kBatches; ++b) {
      plans.push_back(make_plan_bufs(n, E));
      cuda::MoePlanParams p{};
      p.topk_ids = ids[size_t(b)]->as<int32_t>();
      p.plan = plans.back().plan;
      p.assignments = n;
      p.top_k = K;
      p.num_experts = E;
      p.tile_rows = tile_rows;
      cuda::launch_moe_plan(p, s);
    }
    Dev act(size_t(n) * I * 2), y(size_t(n) * H * 2);
    Dev out(size_t(T) * H * 2), out2(size_t(T) * H * 2), shared_out(size_t(T) * H * 2);
    Dev shared_act(size_t(T) * c.shared_inter * 2);
    const int expect = int(std::ceil(cuda::moe_expected_active(T, K, E)));
    // The expert GEMMs' parameters for batch b, weight copy `copy`: gate_up, then down.
    auto gemm_params = [&](int regime, int b, int copy) {
      cuda::MoeGroupedParams g{};
      if (regime == cuda::kMoeDecode) {
        g.topk_ids = ids[size_t(b)]->as<int32_t>();
        g.assignments = n;
        g.num_experts = E;
        g.max_active = int(std::min<int64_t>(E, n));
        g.expect_active = expect;
        g.gemv_tokens = cuda::moe_gemv_tokens(T, K, E);
      } else {
        const PlanBufs& pb = plans[size_t(b)];
        g.offsets = pb.plan.offsets;
        g.tiles = pb.plan.tiles;
        g.counts = pb.plan.counts;
        g.max_tiles = int(cuda::moe_max_tiles(n, E, tile_rows));
        g.tile_rows = tile_rows;
        g.row_token = pb.plan.row_token;
        g.num_experts = E;
      }
      std::pair<cuda::MoeGroupedParams, cuda::MoeGroupedParams> r{g, g};
      cuda::MoeGroupedParams& gu = r.first;
      gu.x = xs[size_t(b)]->as<bf16_bits>();
      gu.rows = T;
      gu.x_div = K;
      gu.out = act.as<bf16_bits>();
      gu.w = layers[size_t(copy)].gate_up.w;
      gu.glu_inter = I;
      cuda::MoeGroupedParams& dn = r.second;
      dn.row_token = nullptr;
      dn.x = act.as<bf16_bits>();
      dn.rows = n;
      dn.x_div = 1;
      dn.out = y.as<bf16_bits>();
      dn.w = layers[size_t(copy)].down.w;
      dn.early_plan = 1;
      const cuda::CudaTunables tun{};  // the product's kernels
      dn.weight_stationary = tun.moe_gemm_weight_stationary ? 1 : 0;
      gu.pipe = dn.pipe = tun.moe_gemm_pipe ? 1 : 0;
      gu.narrow_tails = dn.narrow_tails = g_narrow_tails >= 0         ? g_narrow_tails
                                          : tun.moe_gemm_narrow_tails ? 1
                                                                      : 0;
      return r;
    };
    auto run_gemm = [&](int regime, const cuda::MoeGroupedParams& g) {
      regime == cuda::kMoePrefill ? cuda::launch_moe_gemm(g, s) : cuda::launch_moe_gemv(g, s);
    };
    // which: 0 both projections, 1 gate_up, 2 down.
    auto experts_gemms = [&](int regime, int b, int copy, int which) {
      const auto g = gemm_params(regime, b, copy);
      if (which != 2) run_gemm(regime, g.first);
      if (which != 1) run_gemm(regime, g.second);
    };
    // y's rows: assignment order (decode) or the prefill plan's order.
    auto combine = [&](int b, Dev& o, const bf16_bits* add, int regime) {
      cuda::MoeCombineParams p{};
      p.y = y.as<bf16_bits>();
      p.pos = regime == cuda::kMoePrefill ? plans[size_t(b)].plan.pos : nullptr;
      p.topk_ids = ids[size_t(b)]->as<int32_t>();
      p.topk_weights = wts[size_t(b)]->as<float>();
      p.add = add;
      p.out = o.as<bf16_bits>();
      p.tokens = T;
      p.hidden = H;
      p.top_k = K;
      p.num_experts = E;
      cuda::launch_moe_combine(p, s);
    };
    // The shared expert in MoE dense mode (GEMV up to 32 rows, GEMM above).
    auto shared_params = [&](int b, int copy) {
      cuda::MoeGroupedParams g{};
      g.x = xs[size_t(b)]->as<bf16_bits>();
      g.rows = T;
      g.tile_rows = T >= 192 ? 128 : 64;
      g.gemv_tokens = std::min(T, 32);
      g.out = shared_act.as<bf16_bits>();
      g.w = shared[size_t(copy)].gate_up.w;
      g.glu_inter = c.shared_inter;
      std::pair<cuda::MoeGroupedParams, cuda::MoeGroupedParams> r{g, g};
      r.second.x = shared_act.as<bf16_bits>();
      r.second.out = shared_out.as<bf16_bits>();
      r.second.w = shared[size_t(copy)].down.w;
      r.second.glu_inter = 0;
      return r;
    };
    auto shared_expert = [&](int b, int copy) {
      const auto g = shared_params(b, copy);
      const bool gemm = T > 32;
      gemm ? cuda::launch_moe_gemm(g.first, s) : cuda::launch_moe_gemv(g.first, s);
      gemm ? cuda::launch_moe_gemm(g.second, s) : cuda::launch_moe_gemv(g.second, s);
    };
    // The shared expert through the engine's dense decode GEMVs (gate_up with the SwiGLU
    // epilogue, then down), where they take T rows; false when they do not.
    auto shared_linear = [&](int b, int copy) {
      const int64_t SI = c.shared_inter;
      const bf16_bits* x = xs[size_t(b)]->as<bf16_bits>();
      bf16_bits* mid = shared_act.as<bf16_bits>();
      bf16_bits* o = shared_out.as<bf16_bits>();
      const LinearShared& l = shared_lin[size_t(copy)];
      if (c.shared_format == cuda::kMoeBf16) {
        const cuda::CudaTunables defaults;  // the engine's GEMV launch tunables
        if (T > defaults.gemv_max_rows) return false;
        cuda::GemvParams g{};
        g.m = T;
        g.prefetch_elems = defaults.gemv_prefetch_elems;
        g.block_warps = defaults.gemv_block_warps;
        g.max_ksplit = defaults.gemv_max_ksplit;
        cuda::GemvParams up = g, dn = g;
        up.x = x;
        up.w = l.gu->as<bf16_bits>();
        up.out = mid;
        up.n = 2 * SI;
        up.k = H;
        up.glu_inter = SI;
        dn.x = mid;
        dn.w = l.dn->as<bf16_bits>();
        dn.out = o;
        dn.n = H;
        dn.k = SI;
        cuda::launch_gemv(up, cuda::Launch{s});
        cuda::launch_gemv(dn, cuda::Launch{s});
      } else if (c.shared_format == cuda::kMoeFp8) {
        if (T > cuda::kFp8GemvMaxRows) return false;
        cuda::Fp8GemvParams g{};
        g.m = T;
        g.batches = 1;
        cuda::Fp8GemvParams up = g, dn = g;
        up.x = x;
        up.w = cuda::Fp8Weight{
            l.gu->as<uint8_t>(), l.gu_scale->as<float>(), 2 * SI, H, ceil_div_i64(H, 128), 0, 0};
        up.out = mid;
        up.glu_inter = SI;
        dn.x = mid;
        dn.w = cuda::Fp8Weight{
            l.dn->as<uint8_t>(), l.dn_scale->as<float>(), H, SI, ceil_div_i64(SI, 128), 0, 0};
        dn.out = o;
        cuda::launch_fp8_gemv(up, s);
        cuda::launch_fp8_gemv(dn, s);
      } else {
        if (T > cuda::kInt4GemvMaxRows) return false;
        const Layer& sh = shared[size_t(copy)];
        cuda::Int4LinearParams g{};
        g.m = T;
        g.group = c.shared_group;
        g.preload = 1;
        cuda::Int4LinearParams up = g, dn = g;
        up.x = x;
        up.packed = sh.gate_up.w.values;
        up.scale = static_cast<const bf16_bits*>(sh.gate_up.w.scales);
        up.out = mid;
        up.n = 2 * SI;
        up.k = H;
        up.glu_inter = SI;
        dn.x = mid;
        dn.packed = sh.down.w.values;
        dn.scale = static_cast<const bf16_bits*>(sh.down.w.scales);
        dn.out = o;
        dn.n = H;
        dn.k = SI;
        cuda::launch_int4_gemv(up, s);
        cuda::launch_int4_gemv(dn, s);
      }
      return true;
    };
    const size_t scratch_bytes = cuda::moe_experts_scratch_bytes(T, K, E, H, I);
    Dev scratch(scratch_bytes);
    auto layer = [&](int b, int copy) {
      shared_expert(b, copy);
      router(b, copy);
      route(b);
      cuda::MoeExpertsParams p{};
      p.x = xs[size_t(b)]->as<bf16_bits>();
      p.topk_ids = ids[size_t(b)]->as<int32_t>();
      p.topk_weights = wts[size_t(b)]->as<float>();
      p.add = shared_out.as<bf16_bits>();
      p.out = out.as<bf16_bits>();
      p.scratch = scratch.as<void>();
      p.gate_up = layers[size_t(copy)].gate_up.w;
      p.down = layers[size_t(copy)].down.w;
      p.tokens = T;
      p.top_k = K;
      p.num_experts = E;
      p.regime = cuda::kMoeAuto;
      p.pdl_early = 0;
      cuda::launch_moe_experts(p, s);
    };

    // Check: the two regimes agree (batch 0, copy 0).
    experts_gemms(cuda::kMoeDecode, 0, 0, 0);
    combine(0, out, nullptr, cuda::kMoeDecode);
    experts_gemms(cuda::kMoePrefill, 0, 0, 0);
    combine(0, out2, nullptr, cuda::kMoePrefill);
    CUDA_CHECK(cudaStreamSynchronize(s));
    const double agree = nmse_bf16(out, out2, size_t(T) * H);

    auto at = [](int i) { return std::pair<int, int>(i % kBatches, i % kCopies); };
    const double t_router =
        graph_us(s, calls, reps, [&](int i) { router(at(i).first, at(i).second); });
    const double t_route = graph_us(s, calls, reps, [&](int i) { route(at(i).first); });
    const double t_plan = graph_us(s, calls, reps, [&](int i) {
      cuda::MoePlanParams p{};
      p.topk_ids = ids[size_t(at(i).first)]->as<int32_t>();
      p.plan = plans[size_t(at(i).first)].plan;
      p.assignments = n;
      p.top_k = K;
      p.num_experts = E;
      p.tile_rows = tile_rows;
      cuda::launch_moe_plan(p, s);
    });
    // [regime][both, gate_up, down]
    // Decode is timed only up to 4x the rows per expert of its automatic range (T·k <= 32 E):
    // past that its CTAs re-scan topk_ids per pass of 32 rows, not a regime anyone would pick.
    const bool time_decode = n <= 4 * int64_t(cuda::kMoeDecodeRowsPerExpert) * E;
    double t_exp[2][3] = {};
    for (int r = 0; r < 2; ++r)
      for (int w = 0; w < 3; ++w)
        if (r == 1 || time_decode)
          t_exp[r][w] = graph_us(s, calls, reps, [&](int i) {
            experts_gemms(r == 0 ? cuda::kMoeDecode : cuda::kMoePrefill, at(i).first, at(i).second,
                          w);
          });
    const double t_combine = graph_us(
        s, calls, reps, [&](int i) { combine(at(i).first, out, nullptr, cuda::kMoeDecode); });
    const double t_shared =
        graph_us(s, calls, reps, [&](int i) { shared_expert(at(i).first, at(i).second); });
    const bool has_linear = shared_linear(0, 0);
    const double t_shared_lin =
        has_linear
            ? graph_us(s, calls, reps, [&](int i) { shared_linear(at(i).first, at(i).second); })
            : 0.0;
    const double t_layer =
        graph_us(s, calls, reps, [&](int i) { layer(at(i).first, at(i).second); });

    const int auto_regime = cuda::moe_pick_regime(T, K, E);
    std::printf(
        "moe %-14s T=%-5d touched %.1f experts (%.1f MB) | router %.1f us | route %.1f | "
        "plan (prefill) %.1f | combine %.1f | regimes agree NMSE "
        "%.1e\n",
        c.name.c_str(), T, touched, touched_bytes / 1e6, t_router, t_route, t_plan, t_combine,
        agree);
    const double gu_share = double(layers[0].gate_up.bytes_per_expert) / double(expert_bytes);
    for (int r = 0; r < 2; ++r) {
      if (r == 0 && !time_decode) continue;
      const double gbs = touched_bytes / (t_exp[r][0] * 1e-6) / 1e9;
      const double tf = flops / (t_exp[r][0] * 1e-6) / 1e12;
      std::printf(
          "moe %-14s T=%-5d experts %-7s %9.1f us  %6.0f GB/s = %5.1f%% of copy  %6.1f "
          "TFLOP/s = %5.1f%% of GEMM%s | gate_up %.1f us (%.0f GB/s, %.1f TFLOP/s) | down %.1f "
          "us (%.0f GB/s, %.1f TFLOP/s)\n",
          c.name.c_str(), T, r == 0 ? "decode" : "prefill", t_exp[r][0], gbs,
          100.0 * gbs / ceil.copy_gbs, tf, 100.0 * tf / ceil.gemm_tflops,
          (r == 0) == (auto_regime == cuda::kMoeDecode) ? "  (auto)" : "", t_exp[r][1],
          touched_bytes * gu_share / (t_exp[r][1] * 1e-6) / 1e9,
          flops * 2 / 3 / (t_exp[r][1] * 1e-6) / 1e12, t_exp[r][2],
          touched_bytes * (1 - gu_share) / (t_exp[r][2] * 1e-6) / 1e9,
          flops / 3 / (t_exp[r][2] * 1e-6) / 1e12);
    }
    const double shared_gbs = double(shared_bytes) / (t_shared * 1e-6) / 1e9;
    const double layer_bytes = touched_bytes + double(shared_bytes) + double(router_bytes);
    const double layer_gbs = layer_bytes / (t_layer * 1e-6) / 1e9;
    char lin[96] = "";
    if (has_linear)
      std::snprintf(lin, sizeof lin, " (dense linear GEMVs %.1f us, %.0f GB/s)", t_shared_lin,
                    double(shared_bytes) / (t_shared_lin * 1e-6) / 1e9);
    std::printf(
        "moe %-14s T=%-5d shared %.1f us (%.0f GB/s)%s | layer %.1f us = %.0f GB/s on %.1f MB "
        "= %.1f%% of copy, %.1f TFLOP/s routed\n",
        c.name.c_str(), T, t_shared, shared_gbs, lin, t_layer, layer_gbs, layer_bytes / 1e6,
        100.0 * layer_gbs / ceil.copy_gbs, flops / (t_layer * 1e-6) / 1e12);

    // The prefill down projection's blocks per CTA (x-resident short-k path; -1: the one-block
    // pipeline), automatic first.
    if (sweep && auto_regime == cuda::kMoePrefill && I <= cuda::kMoeGemmShortK) {
      experts_gemms(cuda::kMoePrefill, 0, 0, 1);  // act for the down runs
      CUDA_CHECK(cudaStreamSynchronize(s));
      std::string line;
      char buf[160];
      for (int blocks : {0, -1, 1, 2, 4, 8, 16}) {
        const double us = graph_us(s, calls, reps, [&](int i) {
          cuda::MoeGroupedParams g =
              gemm_params(cuda::kMoePrefill, at(i).first, at(i).second).second;
          g.gemm_blocks = blocks;
          g.weight_stationary = 0;
          cuda::launch_moe_gemm(g, s);
        });
        const int shown = blocks == 0
                              ? cuda::moe_gemm_blocks(gemm_params(cuda::kMoePrefill, 0, 0).second)
                              : blocks;
        std::snprintf(buf, sizeof buf, "%s%d %.1f us %.1f TFLOP/s", blocks == 0 ? "auto " : " | ",
                      shown, us, flops / 3 / (us * 1e-6) / 1e12);
        line += buf;
      }
      if (cuda::moe_gemm_ws_supported(gemm_params(cuda::kMoePrefill, 0, 0).second)) {
        const double us = graph_us(s, calls, reps, [&](int i) {
          cuda::MoeGroupedParams g =
              gemm_params(cuda::kMoePrefill, at(i).first, at(i).second).second;
          g.weight_stationary = 1;
          cuda::launch_moe_gemm(g, s);
        });
        std::snprintf(buf, sizeof buf, " | weight-stationary %.1f us %.1f TFLOP/s", us,
                      flops / 3 / (us * 1e-6) / 1e12);
        line += buf;
        // The product's down again, right after (the same launches): how far the clock's state
        // moves a timing. H100, session 35: Kimi-K2.5 698.0 (weight-stationary) then 767.9 us
        // for the same kernel; the experts line's down 706.8 against this sweep's 628.7 in
        // another process (DeepSeek-V3). Read MoE prefill A/Bs only within one sweep.
        const double again = graph_us(s, calls, reps, [&](int i) {
          experts_gemms(cuda::kMoePrefill, at(i).first, at(i).second, 2);
        });
        std::snprintf(buf, sizeof buf, " | product's down again %.1f us", again);
        line += buf;
      }
      std::printf("sweep %-14s T=%-5d %-14s %s\n", c.name.c_str(), T, "down blocks", line.c_str());
    }
    // The producer-warp GEMM (moe_experts_gemm_pipe.cu) against the product's choice, each
    // projection timed both ways back to back; "-" where it does not apply.
    if (g_producer_warp && auto_regime == cuda::kMoePrefill) {
      experts_gemms(cuda::kMoePrefill, 0, 0, 1);  // act for the down runs
      CUDA_CHECK(cudaStreamSynchronize(s));
      std::string line;
      char buf[240];
      for (int proj = 0; proj < 2; ++proj) {
        auto params = [&](int i) {
          const auto g = gemm_params(cuda::kMoePrefill, at(i).first, at(i).second);
          return proj == 0 ? g.first : g.second;
        };
        const cuda::MoeGroupedParams g0 = params(0);
        // Against the product's kernel, the weight-stationary one included where it applies.
        const bool ok = cuda::moe_gemm_pipe_supported(g0);
        // pipe 0 (two-CTA or weight-stationary), 1
        double us[2] = {0, 0};
        for (int pipe = 0; pipe < (ok ? 2 : 0); ++pipe)
          us[pipe] = graph_us(s, calls, reps, [&](int i) {
            cuda::MoeGroupedParams g = params(i);
            g.pipe = pipe;
            if (pipe) g.weight_stationary = 0;  // pipe 0: the weight-stationary down if default
            cuda::launch_moe_gemm(g, s);
          });
        const double f = flops * (proj == 0 ? 2.0 : 1.0) / 3;
        if (ok)
          std::snprintf(buf, sizeof buf, "%s%s %.1f us -> %.1f us (%.1f -> %.1f TFLOP/s)",
                        proj ? " | " : "", proj ? "down" : "gate_up", us[0], us[1],
                        f / (us[0] * 1e-6) / 1e12, f / (us[1] * 1e-6) / 1e12);
        else
          std::snprintf(buf, sizeof buf, "%s%s -", proj ? " | " : "", proj ? "down" : "gate_up");
        line += buf;
      }
      std::printf("sweep %-14s T=%-5d %-14s %s\n", c.name.c_str(), T, "producer warp",
                  line.c_str());
    }

    // The decode GEMV's work shapes (ksplit/cluster/tiles_per_warp), forced one at a time, for
    // the routed projections and the shared expert: what the cost model should pick.
    if (sweep && auto_regime == cuda::kMoeDecode && T <= sweep_max_tokens) {
      for (int proj = 0; proj < 4; ++proj) {  // routed gate_up, down; shared gate_up, down
        const bool routed = proj < 2;
        auto params = [&](int b, int copy) {
          const auto g = routed ? gemm_params(cuda::kMoeDecode, b, copy) : shared_params(b, copy);
          return proj % 2 == 0 ? g.first : g.second;
        };
        const double bytes = routed ? touched_bytes * (proj == 0 ? gu_share : 1 - gu_share)
                                    : double(proj == 2 ? shared[0].gate_up.bytes_per_expert
                                                       : shared[0].down.bytes_per_expert);
        // down reads act: gate_up first (outside the timing would need a second graph; act of
        // the last gate_up run is valid input for every down, the timing does not depend on it).
        if (proj % 2 == 1) {
          routed ? experts_gemms(cuda::kMoeDecode, 0, 0, 1) : shared_expert(0, 0);
          CUDA_CHECK(cudaStreamSynchronize(s));
        }
        std::string line;
        char buf[160];
        const cuda::MoeGemvShape a = cuda::moe_gemv_shape(params(0, 0));
        for (int si = -1; si < int(std::size(kSweepShapes)); ++si) {
          cuda::MoeGemvShape want = si < 0 ? a : kSweepShapes[si];
          if (si >= 0 && want.ksplit == a.ksplit && want.cluster == a.cluster &&
              want.tiles_per_warp == a.tiles_per_warp)
            continue;
          cuda::MoeGroupedParams probe = params(0, 0);
          probe.ksplit = want.ksplit;
          probe.cluster = want.cluster;
          probe.tiles_per_warp = want.tiles_per_warp;
          if (cuda::moe_gemv_shape(probe).ksplit == 0) continue;
          const double us = graph_us(s, calls, reps, [&](int i) {
            cuda::MoeGroupedParams g = params(at(i).first, at(i).second);
            g.ksplit = want.ksplit;
            g.cluster = want.cluster;
            g.tiles_per_warp = want.tiles_per_warp;
            cuda::launch_moe_gemv(g, s);
          });
          std::snprintf(buf, sizeof buf, "%s%d/%d/%d %.1f us %.0f%%", si < 0 ? "auto " : " | ",
                        want.ksplit, want.cluster, want.tiles_per_warp, us,
                        100.0 * bytes / (us * 1e-6) / 1e9 / ceil.copy_gbs);
          line += buf;
        }
        std::printf("sweep %-14s T=%-5d %-14s %s\n", c.name.c_str(), T,
                    proj == 0   ? "gate_up"
                    : proj == 1 ? "down"
                    : proj == 2 ? "shared gate_up"
                                : "shared down",
                    line.c_str());
      }
    }
    std::fflush(stdout);
  }
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) {
  using namespace strata;
  std::string configs = "kimi,moonlight,moonlight-int4,dsv3", what = "kernels";
  std::string backend_configs = "dsv3,moonlight,kimi";
  std::vector<int> tokens = {1, 8, 32, 128, 512, 8192};
  std::vector<std::string> variants;  // --variants: tunable_variants.h names (backend mode)
  int calls = 16, reps = 5, sweep = 1, sweep_max_tokens = 32;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--configs")
      configs = argv[i + 1];
    else if (a == "--tokens")
      tokens = parse_int_list(argv[i + 1]);
    else if (a == "--calls")
      calls = std::stoi(argv[i + 1]);
    else if (a == "--reps")
      reps = std::stoi(argv[i + 1]);
    else if (a == "--sweep")
      sweep = std::stoi(argv[i + 1]);
    else if (a == "--sweep-max-tokens")
      sweep_max_tokens = std::stoi(argv[i + 1]);
    else if (a == "--what")
      what = argv[i + 1];
    else if (a == "--backend-configs")
      backend_configs = argv[i + 1];
    else if (a == "--producer-warp")
      g_producer_warp = std::stoi(argv[i + 1]);
    else if (a == "--narrow-tails")
      g_narrow_tails = std::stoi(argv[i + 1]);
    else if (a == "--tile-rows") {
      g_tile_rows = std::stoi(argv[i + 1]);
      if (g_tile_rows != 64 && g_tile_rows != 128) {
        std::fprintf(stderr, "--tile-rows: 64 or 128 (the GEMM's instances), not %d\n",
                     g_tile_rows);
        return 2;
      }
    } else if (a == "--variants") {
      const std::string v = argv[i + 1];
      for (size_t b = 0; b < v.size();) {
        const size_t e = std::min(v.find(',', b), v.size());
        variants.push_back(v.substr(b, e - b));
        b = e + 1;
      }
    } else {
      std::fprintf(
          stderr,
          "usage: %s [--what kernels,backend] [--configs kimi,moonlight,moonlight-int4,dsv3] "
          "[--backend-configs dsv3,moonlight,kimi] [--tokens 1,8,...] [--calls 16] [--reps 5] "
          "[--sweep 1] [--sweep-max-tokens 32] [--variants a,b] [--tile-rows 64|128] "
          "[--producer-warp 0|1] [--narrow-tails 0|1]\n",
          argv[0]);
      return 2;
    }
  }
  cudaStream_t s;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cublasHandle_t h;
  CHECK(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS);
  CHECK(cublasSetStream(h, s) == CUBLAS_STATUS_SUCCESS);
  Dev workspace(size_t(32) << 20);  // fixed cuBLAS workspace: no allocation inside a capture
  CHECK(cublasSetWorkspace(h, workspace.as<void>(), workspace.bytes()) == CUBLAS_STATUS_SUCCESS);
  cuda::init_moe_gemm_kernels();
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device   %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  const Ceilings ceil = measure_ceilings(s, h);
  const std::string list = "," + configs + ",", whats = "," + what + ",";
  if (whats.find(",kernels,") != std::string::npos)
    for (const Config& c : kConfigs)
      if (list.find("," + c.name + ",") != std::string::npos)
        run_config(c, tokens, calls, reps, sweep != 0, sweep_max_tokens, ceil, s, h);
  const std::string blist = "," + backend_configs + ",";
  if (whats.find(",backend,") != std::string::npos)
    for (const moe_bench::BackendLayerConfig& c : moe_bench::kBackendLayers)
      if (blist.find("," + std::string(c.name) + ",") != std::string::npos)
        moe_bench::run_backend_layer(c, tokens, calls, reps, ceil, variants);
  cublasDestroy(h);
  cudaStreamDestroy(s);
  return 0;
}
