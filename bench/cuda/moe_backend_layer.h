// One MoE layer through the CUDA backend's ops (issue 23's wiring, backend/cuda/moe.cu), called
// as arch/deepseek.cc's moe_block calls them: the shared experts (linear, silu_mul, linear), the
// router (a linear into float32), moe_route, then moe_experts_add (the shared output added by
// the combine). moe_bench.cc --what backend runs it; --what kernels times the kernels alone.
//
// Sizes, formats and routing come from ../shared/configs through the planner's inventory
// (model/inventory.h: one tensor-parallel rank's slice of every expert, each weight's stored
// format; arch route_args_from), weights are random in that stored format and go up through the
// backend's own upload_linear: the device holds exactly what a real checkpoint's layer takes.
//   dsv3       DeepSeek-V3, one rank of tp 8: 256 experts, 7168 -> 256, FP8 128x128 blocks
//   moonlight  Moonlight-16B-A3B at tp 1: 64 experts, 2048 -> 1408, bf16
//   kimi       Kimi-K2.5, one rank of tp 8: 384 experts, 7168 -> 256, INT4 group 32
// Timing: `calls` layers back to back, alternating two copies of the weights (no layer's bytes
// are still in L2 when it runs again) and four hidden-state batches, captured from the
// backend's stream as one CUDA graph after an eager warm-up (so the pool already holds every
// block the ops take), median of `reps` replays. Bandwidth counts the experts the routing
// touched (distinct ids of each batch), plus, for the layer, the shared experts and the router.
#pragma once

#include <cmath>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "arch/model.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/moe_experts.h"
#include "model/config.h"
#include "model/inventory.h"
#include "moe_bench_common.h"
#include "tunable_variants.h"

namespace strata::moe_bench {

struct BackendLayerConfig {
  const char* name;
  const char* config;  // ../shared/configs/<config>
  int tp;
};
inline const BackendLayerConfig kBackendLayers[] = {
    {"dsv3", "deepseek-v3", 8}, {"moonlight", "moonlight-16b-a3b", 1}, {"kimi", "kimi-k2.5", 8}};

// A random [stack, out, in] weight stored in `f` (core/weight_format.h layouts), y = x · Wᵀ of
// order 1 for x of order 1: bf16 values; fp8 e4m3 bytes without NaN (the exponent's lowest bit
// cleared) and float32 block scales; INT4 random nibbles and bf16 group scales.
inline HostLinearWeight random_stored(const LinearFormat& f, int64_t stack, int64_t out, int64_t in,
                                      uint64_t seed) {
  HostLinearWeight w;
  w.format = f;
  w.stack = stack;
  w.out = out;
  w.in = in;
  w.values.resize(size_t(stack * w.matrix_values_bytes()));
  w.scales.resize(size_t(stack * w.matrix_scales_bytes()));
  const float rms = 1.0f / std::sqrt(float(in));
  uint64_t st = seed;
  auto uniform = [&] { return float(splitmix(st) >> 40) / float(1 << 24); };  // [0, 1)
  if (f.format == WeightFormat::kDense) {  // four bf16 values per 64 random bits
    CHECK(f.dense_dtype == DType::kBF16);
    for (size_t i = 0; i < w.values.size(); i += 8) {
      const uint64_t r = splitmix(st);
      for (size_t j = 0; j < 4 && i + 2 * j + 2 <= w.values.size(); ++j) {
        const float u = float((r >> (16 * j)) & 0xffff) / 65535.0f;
        const uint16_t b = f32_to_bf16((u * 2.0f - 1.0f) * rms * 1.7f);
        std::memcpy(&w.values[i + 2 * j], &b, 2);
      }
    }
    return w;
  }
  for (size_t i = 0; i < w.values.size(); i += 8) {
    uint64_t r = splitmix(st);
    if (f.format == WeightFormat::kFp8Block) r &= 0xf7f7f7f7f7f7f7f7ull;
    std::memcpy(&w.values[i], &r, std::min<size_t>(8, w.values.size() - i));
  }
  if (f.format == WeightFormat::kFp8Block) {
    for (size_t i = 0; i + 4 <= w.scales.size(); i += 4) {
      const float s = rms / 50.0f * (0.5f + uniform());
      std::memcpy(&w.scales[i], &s, 4);
    }
  } else {
    for (size_t i = 0; i + 2 <= w.scales.size(); i += 2) {
      const uint16_t s = f32_to_bf16(rms / 4.6f * (0.5f + uniform()));
      std::memcpy(&w.scales[i], &s, 2);
    }
  }
  return w;
}

// A second device copy of a weight (the alternating copy of the timing loop).
inline LinearWeight copy_weight(Backend& be, const LinearWeight& w) {
  LinearWeight c;
  auto dup = [&](const DeviceTensorPtr& t) -> DeviceTensorPtr {
    if (!t) return nullptr;
    auto d = be.alloc(t->view().dtype, t->view().shape);
    CUDA_CHECK(cudaMemcpy(d->view().data, t->view().data, size_t(t->view().nbytes()),
                          cudaMemcpyDeviceToDevice));
    return d;
  };
  c.weight = dup(w.weight);
  c.scales = dup(w.scales);
  c.bias = dup(w.bias);
  c.format = w.format;
  c.stack = w.stack;
  c.out = w.out;
  c.in = w.in;
  return c;
}

inline int64_t weight_bytes(const LinearWeight& w) {
  int64_t n = 0;
  for (const DeviceTensorPtr* t : {&w.weight, &w.scales, &w.bias})
    if (*t) n += (*t)->view().nbytes();
  return n;
}

struct BackendLayer {
  LinearWeight router, shared_gu, shared_down;
  MoeExpertWeights experts;
};

// variants: tunable_variants.h names; each T's experts are also timed under each (same weights,
// same routing), printed as "variant NAME experts X us = Y% of copy".
inline void run_backend_layer(const BackendLayerConfig& cfg, const std::vector<int>& token_counts,
                              int calls, int reps, const Ceilings& ceil,
                              const std::vector<std::string>& variants = {}) {
  auto spec = load_model_spec(std::string(STRATA_SHARED_DIR) + "/configs/" + cfg.config);
  CHECK_MSG(spec.ok(), "{}", spec.status().to_string());
  const QuantLayout layout = quant_layout(*spec);
  int layer = 0;
  while (!spec->is_moe_layer(layer)) ++layer;
  // The layer's weights as one rank holds them: stored format and shape of each.
  LinearFormat router_f, expert_f, shared_f;
  int64_t hidden = spec->hidden_size, inter = 0, shared_inter = 0;
  bool has_bias = false;
  for (const WeightEntry& w : build_inventory(*spec)) {
    if (w.layer != layer) continue;
    const std::vector<int64_t> shape = shard_shape(w, cfg.tp);
    const bool gate = w.name.find("gate_proj") != std::string::npos;
    if (w.role == WeightRole::kRouter) {
      if (w.name.find("bias") != std::string::npos)
        has_bias = true;
      else
        router_f = stored_format(w, layout);
    } else if (w.role == WeightRole::kRoutedExpert && w.expert == 0 && gate) {
      expert_f = stored_format(w, layout);
      inter = shape[0];
    } else if (w.role == WeightRole::kSharedExpert && gate) {
      shared_f = stored_format(w, layout);
      shared_inter = shape[0];
    }
  }
  const MoeRouteArgs args = route_args_from(*spec);
  const int E = args.num_experts, K = args.top_k;
  CHECK(inter > 0 && E > 0);

  auto be_ptr = make_cuda_backend();
  auto& be = dynamic_cast<cuda::CudaBackend&>(*be_ptr);
  std::vector<BackendLayer> copies(2);
  copies[0].experts.gate_up =
      be.upload_linear(random_stored(expert_f, E, 2 * inter, hidden, 1), Tensor{});
  copies[0].experts.down = be.upload_linear(random_stored(expert_f, E, hidden, inter, 2), Tensor{});
  copies[0].router = be.upload_linear(random_stored(router_f, 1, E, hidden, 3), Tensor{});
  if (shared_inter > 0) {
    copies[0].shared_gu =
        be.upload_linear(random_stored(shared_f, 1, 2 * shared_inter, hidden, 4), Tensor{});
    copies[0].shared_down =
        be.upload_linear(random_stored(shared_f, 1, hidden, shared_inter, 5), Tensor{});
  }
  for (LinearWeight BackendLayer::*w :
       {&BackendLayer::router, &BackendLayer::shared_gu, &BackendLayer::shared_down})
    if ((copies[0].*w).weight) copies[1].*w = copy_weight(be, copies[0].*w);
  copies[1].experts.gate_up = copy_weight(be, copies[0].experts.gate_up);
  copies[1].experts.down = copy_weight(be, copies[0].experts.down);
  std::vector<float> bias_h(static_cast<size_t>(E));
  {
    uint64_t st = 99;
    for (float& b : bias_h) b = (float(splitmix(st) % 20001) / 10000.0f - 1.0f) * 0.01f;
  }
  auto bias = be.upload(Tensor::make(bias_h.data(), DType::kF32, {E}), DType::kF32);
  const Tensor bias_t = has_bias ? bias->view() : Tensor{};
  const int64_t expert_bytes =
      (weight_bytes(copies[0].experts.gate_up) + weight_bytes(copies[0].experts.down)) / E;
  const int64_t other_bytes = weight_bytes(copies[0].router) + weight_bytes(copies[0].shared_gu) +
                              weight_bytes(copies[0].shared_down);
  std::printf(
      "\nbackend %s (%s, tp %d, layer %d): E %d top-%d, hidden %lld, expert inter %lld %s (%.2f MB "
      "each), shared "
      "inter %lld %s, router %s%s; router + shared %.2f MB\n",
      cfg.name, cfg.config, cfg.tp, layer, E, K, (long long)hidden, (long long)inter,
      expert_f.str().c_str(), expert_bytes / 1e6, (long long)shared_inter, shared_f.str().c_str(),
      router_f.str().c_str(), has_bias ? " + correction bias" : "", other_bytes / 1e6);

  constexpr int kLayerBatches = 4;
  for (const int T : token_counts) {
    std::vector<DeviceTensorPtr> xs, ids, wts;
    for (int b = 0; b < kLayerBatches; ++b) {
      xs.push_back(be.alloc(DType::kBF16, {T, hidden}));
      be.fill_random(*xs.back(), 1000 + b, 1.0f);
      ids.push_back(be.alloc(DType::kI32, {T, K}));
      wts.push_back(be.alloc(DType::kF32, {T, K}));
    }
    auto logits = be.alloc(DType::kF32, {T, E});
    auto gu = be.alloc(DType::kBF16, {T, 2 * std::max<int64_t>(shared_inter, 1)});
    auto act = be.alloc(DType::kBF16, {T, std::max<int64_t>(shared_inter, 1)});
    auto shared_out = be.alloc(DType::kBF16, {T, hidden}),
         out = be.alloc(DType::kBF16, {T, hidden});
    if (shared_inter == 0) be.fill_random(*shared_out, 7, 0.0f);
    auto shared = [&](int b, int c) {
      if (shared_inter == 0) return;
      be.linear(*xs[size_t(b)], copies[size_t(c)].shared_gu, *gu);
      be.silu_mul(*gu, *act);
      be.linear(*act, copies[size_t(c)].shared_down, *shared_out);
    };
    auto route = [&](int b, int c) {
      be.linear(*xs[size_t(b)], copies[size_t(c)].router, *logits);
      be.moe_route(*logits, bias_t, args, *ids[size_t(b)], *wts[size_t(b)]);
    };
    auto experts = [&](int b, int c) {
      be.moe_experts_add(*xs[size_t(b)], copies[size_t(c)].experts, *ids[size_t(b)],
                         *wts[size_t(b)], *shared_out, *out);
    };
    auto layer_step = [&](int b, int c) {
      shared(b, c);
      route(b, c);
      experts(b, c);
    };
    // Route every batch (eagerly) and count the experts each touches.
    double touched = 0;
    for (int b = 0; b < kLayerBatches; ++b) {
      route(b, 0);
      std::vector<float> h(static_cast<size_t>(T * K));
      be.download_f32(*ids[size_t(b)], h.data());
      touched += double(std::set<float>(h.begin(), h.end()).size()) / kLayerBatches;
    }
    auto timed = [&](auto&& fn) {
      auto at = [](int i) { return std::pair<int, int>(i % kLayerBatches, i % 2); };
      for (int i = 0; i < calls; ++i) fn(at(i).first, at(i).second);  // warm-up: the pool's blocks
      be.synchronize();
      const double us =
          graph_us(be.stream(), calls, reps, [&](int i) { fn(at(i).first, at(i).second); });
      be.synchronize();
      return us;
    };
    const double t_experts = timed(experts), t_route = timed(route), t_shared = timed(shared);
    const double t_layer = timed(layer_step);
    const double touched_bytes = touched * double(expert_bytes),
                 layer_bytes = touched_bytes + double(other_bytes);
    const double flops = 2.0 * double(T) * K * 3.0 * double(hidden) * double(inter);
    const double exp_gbs = touched_bytes / (t_experts * 1e-6) / 1e9,
                 layer_gbs = layer_bytes / (t_layer * 1e-6) / 1e9;
    int64_t fallbacks = 0;
    for (const auto& [op, n] : be.cpu_fallback_counts())
      if (op == "moe_route" || op == "moe_experts" || op == "linear_f32_out") fallbacks += n;
    std::printf(
        "backend %-9s T=%-5d %s touched %.1f experts (%.1f MB) | layer %.1f us = %.0f GB/s = "
        "%.1f%% of copy | "
        "experts %.1f us = %.0f GB/s = %.1f%% of copy, %.1f TFLOP/s = %.1f%% of GEMM | "
        "router+route %.1f us | "
        "shared %.1f us | MoE ops on the CPU twin: %lld\n",
        cfg.name, T, cuda::moe_pick_regime(T, K, E) == cuda::kMoeDecode ? "decode " : "prefill",
        touched, touched_bytes / 1e6, t_layer, layer_gbs, 100.0 * layer_gbs / ceil.copy_gbs,
        t_experts, exp_gbs, 100.0 * exp_gbs / ceil.copy_gbs, flops / (t_experts * 1e-6) / 1e12,
        100.0 * flops / (t_experts * 1e-6) / 1e12 / ceil.gemm_tflops, t_route, t_shared,
        (long long)fallbacks);
    // Each variant against the default timed around it, default and variant alternating (twice
    // each): a variant timed once after the default read up to ~4% slower with no change at all
    // (the same kernels, 2026-12-04: the GPU's clocks drift over a run).
    for (const std::string& name : variants) {
      const bench::Variant* v = bench::find_variant(name);
      CHECK_MSG(v != nullptr, "moe_bench: unknown variant {}", name);
      const cuda::CudaTunables saved = be.tunables();
      double us = 0, base = 0;
      for (int round = 0; round < 2; ++round) {
        base += timed(experts) / 2;
        be.tune(v->apply);
        us += timed(experts) / 2;
        be.set_tunables(saved);
      }
      const double gbs = touched_bytes / (us * 1e-6) / 1e9;
      std::printf(
          "variant  %-9s T=%-5d %-14s experts %.1f us = %.0f GB/s = %.1f%% of copy (default %.1f "
          "us, alternating; %+.1f%%)\n",
          cfg.name, T, name.c_str(), us, gbs, 100.0 * gbs / ceil.copy_gbs, base,
          100.0 * (us / base - 1.0));
    }
    std::fflush(stdout);
  }
}

}  // namespace strata::moe_bench
