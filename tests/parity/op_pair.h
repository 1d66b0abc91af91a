// The CUDA op parity tests' fixture: the same inputs on the CPU reference and the CUDA backend,
// and the NMSE of their outputs (ops_parity_test.cc states the bounds), with the linear and
// paged-attention cases that the product's tests and the development kernels' tests
// (bench/cuda/dev/dev_parity_test.cc) share.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "tree_masks.h"

namespace strata::parity {

// The bytes of a GPU tensor.
inline std::vector<char> device_bytes(const Tensor& t) {
  std::vector<char> host(size_t(t.nbytes()));
  EXPECT_EQ(cudaMemcpy(host.data(), t.data, host.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  return host;
}

// The CUDA backend's per-op profile of `fn` (eager launches): which ops ran.
template <typename F>
std::string profiled(cuda::CudaBackend& be, F&& fn) {
  be.set_profile(true);
  fn();
  std::string report = be.profile_report(1);
  be.set_profile(false);
  return report;
}

// A graph-mode launch merge against the eager launches (gemv_pair_parity_test.cc,
// head_gemv_linear_parity_test.cc): `fill(seed)` sets a step's inputs, `step()` records one step
// and ends it (a download), returning its outputs as floats. The eager steps of seeds 1 and 2 are
// the reference; then with tune(t, on) for on = true, then false, three graph-mode steps (seeds 1,
// 2, 1: one capture, two replays) must each give their seed's eager bits and record
// launches(on) launches a step. `what` names the case in failures.
template <class Fill, class Step, class Tune, class Launches>
void expect_merge_keeps_eager_bits(cuda::CudaBackend& gpu, Fill&& fill, Step&& step, Tune&& tune,
                                   Launches&& launches, const std::string& what) {
  std::vector<std::vector<float>> eager;
  for (uint64_t seed : {1, 2}) {
    fill(seed);
    eager.push_back(step());
  }
  for (bool on : {true, false}) {
    gpu.tune([&](cuda::CudaTunables& t) { tune(t, on); });
    gpu.set_graph_mode(true);
    const cuda::GraphStats before = gpu.graph_stats();
    for (uint64_t seed : {1, 2, 1}) {
      fill(seed);
      const std::vector<float> got = step();
      EXPECT_EQ(0, std::memcmp(got.data(), eager[seed - 1].data(), got.size() * 4))
          << what << " on " << on << " seed " << seed;
    }
    const cuda::GraphStats& after = gpu.graph_stats();
    EXPECT_EQ(after.captures - before.captures, 1) << what;
    EXPECT_EQ(after.replays - before.replays, 2) << what;
    EXPECT_EQ(after.launches - before.launches, 3 * launches(on)) << what << " on " << on;
    gpu.set_graph_mode(false);
  }
}

class Pair {
 public:
  Pair() : cpu_(make_cpu_backend()), gpu_(make_cuda_backend()), rng_(1234) {}

  std::vector<float> random(int64_t n, float scale = 1.0f) {
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> v(size_t(n), 0.0f);
    for (float& x : v) x = round_to_bf16(d(rng_));
    return v;
  }
  // The same values on both backends (bf16 on the GPU, f32 on the CPU).
  struct Both {
    DeviceTensorPtr cpu, gpu;
  };
  Both make(const std::vector<float>& v, const Shape& shape, DType gpu_dtype = DType::kBF16) {
    Tensor host = Tensor::make(const_cast<float*>(v.data()), DType::kF32, shape);
    return {cpu_->upload(host, DType::kF32), gpu_->upload(host, gpu_dtype)};
  }
  // Output tensors: CPU zeros, GPU poisoned with NaN.
  Both out(const Shape& shape) {
    std::vector<float> nan(size_t(shape_numel(shape)), NAN);
    return make(nan, shape);
  }
  std::vector<float> get(const Tensor& t, bool gpu) {
    std::vector<float> v(size_t(t.numel()));
    (gpu ? gpu_ : cpu_)->download_f32(t, v.data());
    return v;
  }
  double nmse(const Both& b) {
    auto c = get(*b.cpu, false), g = get(*b.gpu, true);
    double num = 0, den = 0;
    for (size_t i = 0; i < c.size(); ++i) {
      if (!std::isfinite(g[i])) return INFINITY;
      num += double(g[i] - c[i]) * (g[i] - c[i]);
      den += double(c[i]) * c[i];
    }
    return den > 0 ? num / den : num;
  }
  // An RMSNorm weight of k values around 1 (1 + N(0, 0.5)) on the GPU only, bf16 or float32.
  DeviceTensorPtr norm_weight(int64_t k, bool f32) {
    auto v = random(k, 0.5f);
    for (float& x : v) x += 1.0f;
    return gpu_->upload(Tensor::make(v.data(), DType::kF32, {k}), f32 ? DType::kF32 : DType::kBF16);
  }
  std::mt19937& rng() { return rng_; }
  cuda::CudaBackend& cuda() { return dynamic_cast<cuda::CudaBackend&>(*gpu_); }

  std::unique_ptr<Backend> cpu_, gpu_;

 private:
  std::mt19937 rng_;
};

struct LinearCase {
  int m, k, n;
  bool bias;
};

// out = x · wᵀ (+ bias) on both backends (bf16 weights on the GPU); returns the NMSE.
inline double linear_nmse(Pair& p, const LinearCase& c) {
  auto x = p.make(p.random(int64_t(c.m) * c.k), {c.m, c.k});
  LinearWeight wc, wg;
  auto w = p.random(int64_t(c.n) * c.k, 0.05f);
  Tensor wh = Tensor::make(w.data(), DType::kF32, {c.n, c.k});
  wc.weight = p.cpu_->upload(wh, DType::kF32);
  wg.weight = p.gpu_->upload(wh, DType::kBF16);
  if (c.bias) {
    auto b = p.random(c.n);
    Tensor bh = Tensor::make(b.data(), DType::kF32, {c.n});
    wc.bias = p.cpu_->upload(bh, DType::kF32);
    wg.bias = p.gpu_->upload(bh, DType::kF32);
  }
  auto out = p.out({c.m, c.n});
  p.cpu_->linear(*x.cpu, wc, *out.cpu);
  p.gpu_->linear(*x.gpu, wg, *out.gpu);
  return p.nmse(out);
}

// One attention problem: sequences with (cached, new) token counts, scrambled pages.
struct AttnCase {
  int heads, kv_heads, head_dim, page_size;
  std::vector<std::pair<int, int>> seqs;  // (cached, new)
};

// `setup` prepares the CUDA backend first (tunables, development kernels). `trees`: sequences of
// 2..64 new tokens are random draft trees (AttentionMetadata::tree_mask).
inline void run_attention(const AttnCase& c,
                          const std::function<void(cuda::CudaBackend&)>& setup = nullptr,
                          bool trees = false) {
  Pair p;
  if (setup) setup(p.cuda());
  const int n = int(c.seqs.size());
  const int k_dim = c.kv_heads * c.head_dim;
  std::vector<int32_t> q_indptr{0}, kv_lens, page_indptr{0}, pages, positions, slots;
  std::vector<int32_t> all_slots;  // every context token, for filling the cache
  int64_t total_pages = 0;
  for (auto [cached, fresh] : c.seqs)
    total_pages += (cached + fresh + c.page_size - 1) / c.page_size;
  std::vector<int32_t> perm(size_t(total_pages + 3));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), p.rng());
  int next_page = 0;
  for (auto [cached, fresh] : c.seqs) {
    const int len = cached + fresh, np = (len + c.page_size - 1) / c.page_size;
    for (int i = 0; i < np; ++i) pages.push_back(perm[size_t(next_page++)]);
    page_indptr.push_back(int32_t(pages.size()));
    kv_lens.push_back(len);
    q_indptr.push_back(q_indptr.back() + fresh);
    const int32_t* sp = pages.data() + page_indptr[page_indptr.size() - 2];
    for (int j = 0; j < len; ++j) {
      const int32_t slot = sp[j / c.page_size] * c.page_size + j % c.page_size;
      all_slots.push_back(slot);
      if (j >= cached) {
        positions.push_back(j);
        slots.push_back(slot);
      }
    }
  }
  const int t_new = q_indptr.back(), t_all = int(all_slots.size());
  KvLayout lay{.num_layers = 1,
               .num_pages = int64_t(perm.size()),
               .page_size = c.page_size,
               .k_dim = k_dim,
               .v_dim = k_dim};
  KvLayout lay_cpu = lay, lay_gpu = lay;
  lay_cpu.dtype = DType::kF32;
  lay_gpu.dtype = DType::kBF16;
  auto kv_cpu = p.cpu_->alloc_kv(lay_cpu);
  auto kv_gpu = p.gpu_->alloc_kv(lay_gpu);
  // Fill every context token's K/V in one write.
  auto k = p.make(p.random(int64_t(t_all) * k_dim), {t_all, k_dim});
  auto v = p.make(p.random(int64_t(t_all) * k_dim), {t_all, k_dim});
  std::vector<int32_t> fill_pos(size_t(t_all), 0);
  AttentionMetadata fill{.num_seqs = 0,
                         .num_tokens = t_all,
                         .page_size = c.page_size,
                         .q_indptr = q_indptr.data(),
                         .kv_lens = kv_lens.data(),
                         .page_indptr = page_indptr.data(),
                         .page_indices = pages.data(),
                         .positions = fill_pos.data(),
                         .slot_mapping = all_slots.data()};
  p.cpu_->kv_write(*kv_cpu, 0, *k.cpu, *v.cpu, fill);
  p.gpu_->kv_write(*kv_gpu, 0, *k.gpu, *v.gpu, fill);

  AttentionMetadata meta{.num_seqs = n,
                         .num_tokens = t_new,
                         .page_size = c.page_size,
                         .q_indptr = q_indptr.data(),
                         .kv_lens = kv_lens.data(),
                         .page_indptr = page_indptr.data(),
                         .page_indices = pages.data(),
                         .positions = positions.data(),
                         .slot_mapping = slots.data()};
  const std::vector<uint64_t> tree =
      trees ? random_tree_mask(q_indptr, p.rng()) : std::vector<uint64_t>();
  if (trees) meta.tree_mask = tree.data();
  auto q = p.make(p.random(int64_t(t_new) * c.heads * c.head_dim), {t_new, c.heads, c.head_dim});
  auto out = p.out({t_new, c.heads, c.head_dim});
  AttentionArgs args{.scale = float(1.0 / std::sqrt(double(c.head_dim))),
                     .num_heads = c.heads,
                     .num_kv_heads = c.kv_heads,
                     .head_dim = c.head_dim,
                     .v_head_dim = c.head_dim};
  p.cpu_->paged_attention(*q.cpu, *kv_cpu, 0, meta, args, *out.cpu);
  p.gpu_->paged_attention(*q.gpu, *kv_gpu, 0, meta, args, *out.gpu);
  const double e = p.nmse(out);
  EXPECT_LT(e, 1e-4) << "heads " << c.heads << "/" << c.kv_heads << " hd " << c.head_dim << " page "
                     << c.page_size;
  std::printf("attention heads %d/%d hd %d page %d seqs %d tokens %d%s: nmse %.3g\n", c.heads,
              c.kv_heads, c.head_dim, c.page_size, n, t_new, trees ? " (trees)" : "", e);
}

// The grouped prefill kernels' tile-edge cases (CudaParity.PrefillAttentionTiles).
inline std::vector<AttnCase> prefill_tile_cases() {
  return {{8, 8, 128, 16, {{0, 300}, {129, 128}, {64, 64}}},
          {6, 2, 64, 5, {{0, 100}, {37, 43}, {0, 1}}},
          {8, 2, 128, 16, {{64, 64}, {0, 63}, {128, 65}, {1, 128}, {63, 1}, {256, 129}}},
          {32, 4, 128, 16, {{0, 257}, {1000, 17}}},
          {16, 1, 64, 8, {{0, 40}, {5, 9}, {3000, 2}}},
          {32, 8, 128, 16, {{1500, 700}}}};
}

}  // namespace strata::parity
