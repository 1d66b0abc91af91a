// Paged attention over fp8 KV caches on the CPU reference and the CUDA backend (the caches
// written by each backend's kv_write from the same bf16 K/V), for kv_fp8_parity_test.cc and the
// development kernels' tests (bench/cuda/dev/dev_parity_test.cc).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"

namespace strata::parity {

struct Backends {
  std::unique_ptr<Backend> cpu = make_cpu_backend(), gpu = make_cuda_backend();
  DeviceTensorPtr up(Backend& b, const std::vector<float>& v, const Shape& shape, DType dt) {
    Tensor h = Tensor::make(const_cast<float*>(v.data()), DType::kF32, shape);
    return b.upload(h, dt);
  }
  std::vector<char> raw(const Tensor& t, bool on_gpu) {
    std::vector<char> out(static_cast<size_t>(t.nbytes()));
    if (on_gpu)
      CUDA_CHECK(cudaMemcpy(out.data(), t.data, out.size(), cudaMemcpyDeviceToHost));
    else
      std::memcpy(out.data(), t.data, out.size());
    return out;
  }
};

inline KvLayout two_layer_layout(int k_dim, int64_t pages, int page_size, DType fp8) {
  KvLayout lay{.num_layers = 2,
               .num_pages = pages,
               .page_size = page_size,
               .k_dim = k_dim,
               .v_dim = k_dim,
               .dtype = fp8};
  lay.layer_dtypes = {DType::kBF16, fp8};  // mixed: layer 0 stays bf16
  return lay;
}

// Attention over the same fp8 cache on both backends (written by each backend's kv_write from
// the same bf16 K/V: equal bytes, as the test above checks).
// `setup` prepares the CUDA backend first (tunables, development kernels).
inline void run_fp8_attention(DType dt, int heads, int kv_heads, int hd, int page,
                              const std::vector<std::pair<int, int>>& seqs, float ks, float vs,
                              const std::function<void(cuda::CudaBackend&)>& setup = nullptr) {
  Backends b;
  if (setup) setup(dynamic_cast<cuda::CudaBackend&>(*b.gpu));
  std::mt19937 rng(99);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  auto random = [&](int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = round_to_bf16(nd(rng));
    return v;
  };
  const int n = int(seqs.size()), k_dim = kv_heads * hd;
  std::vector<int32_t> q_indptr{0}, kv_lens, page_indptr{0}, pages, positions, slots, all_slots;
  int64_t total_pages = 0;
  for (auto [cached, fresh] : seqs) total_pages += (cached + fresh + page - 1) / page;
  std::vector<int32_t> perm(static_cast<size_t>(total_pages + 2));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  int next = 0;
  for (auto [cached, fresh] : seqs) {
    const int len = cached + fresh, np = (len + page - 1) / page;
    const size_t first = pages.size();
    for (int i = 0; i < np; ++i) pages.push_back(perm[size_t(next++)]);
    page_indptr.push_back(int32_t(pages.size()));
    kv_lens.push_back(len);
    q_indptr.push_back(q_indptr.back() + fresh);
    for (int j = 0; j < len; ++j) {
      const int32_t slot = pages[first + size_t(j / page)] * page + j % page;
      all_slots.push_back(slot);
      if (j >= cached) {
        positions.push_back(j);
        slots.push_back(slot);
      }
    }
  }
  const int t_new = q_indptr.back(), t_all = int(all_slots.size());
  KvLayout lay = two_layer_layout(k_dim, int64_t(perm.size()), page, dt);
  auto kc = b.cpu->alloc_kv(lay), kg = b.gpu->alloc_kv(lay);
  kc->set_scales(1, ks, vs);
  kg->set_scales(1, ks, vs);
  auto kvals = random(int64_t(t_all) * k_dim), vvals = random(int64_t(t_all) * k_dim);
  for (float& x : kvals) x *= ks;  // values of the scale's order, as calibration would give
  for (float& x : vvals) x *= vs;
  std::vector<int32_t> fill_pos(size_t(t_all), 0);
  const int32_t none[1] = {0};
  AttentionMetadata fill{.num_seqs = 0,
                         .num_tokens = t_all,
                         .page_size = page,
                         .q_indptr = none,
                         .kv_lens = none,
                         .page_indptr = none,
                         .page_indices = none,
                         .positions = fill_pos.data(),
                         .slot_mapping = all_slots.data()};
  auto k_c = b.up(*b.cpu, kvals, {t_all, k_dim}, DType::kF32);
  auto v_c = b.up(*b.cpu, vvals, {t_all, k_dim}, DType::kF32);
  auto k_g = b.up(*b.gpu, kvals, {t_all, k_dim}, DType::kBF16);
  auto v_g = b.up(*b.gpu, vvals, {t_all, k_dim}, DType::kBF16);
  b.cpu->kv_write(*kc, 1, *k_c, *v_c, fill);
  b.gpu->kv_write(*kg, 1, *k_g, *v_g, fill);
  AttentionMetadata meta{.num_seqs = n,
                         .num_tokens = t_new,
                         .page_size = page,
                         .q_indptr = q_indptr.data(),
                         .kv_lens = kv_lens.data(),
                         .page_indptr = page_indptr.data(),
                         .page_indices = pages.data(),
                         .positions = positions.data(),
                         .slot_mapping = slots.data()};
  auto qv = random(int64_t(t_new) * heads * hd);
  auto q_c = b.up(*b.cpu, qv, {t_new, heads, hd}, DType::kF32);
  auto q_g = b.up(*b.gpu, qv, {t_new, heads, hd}, DType::kBF16);
  std::vector<float> nan(size_t(t_new) * heads * hd, NAN);
  auto o_c = b.up(*b.cpu, nan, {t_new, heads, hd}, DType::kF32);
  auto o_g = b.up(*b.gpu, nan, {t_new, heads, hd}, DType::kBF16);
  AttentionArgs args{.scale = float(1.0 / std::sqrt(double(hd))),
                     .num_heads = heads,
                     .num_kv_heads = kv_heads,
                     .head_dim = hd,
                     .v_head_dim = hd};
  b.cpu->paged_attention(*q_c, *kc, 1, meta, args, *o_c);
  b.gpu->paged_attention(*q_g, *kg, 1, meta, args, *o_g);
  std::vector<float> c(nan.size()), g(nan.size());
  b.cpu->download_f32(*o_c, c.data());
  b.gpu->download_f32(*o_g, g.data());
  double num = 0, den = 0;
  for (size_t i = 0; i < c.size(); ++i) {
    num += std::isfinite(g[i]) ? double(g[i] - c[i]) * (g[i] - c[i]) : INFINITY;
    den += double(c[i]) * c[i];
  }
  const double e = num / den;
  std::printf(
      "fp8 attention %s heads %d/%d hd %d page %d seqs %d new %d scales %.2f/%.2f: nmse %.3g\n",
      dtype_name(dt), heads, kv_heads, hd, page, n, t_new, ks, vs, e);
  EXPECT_LT(e, 1e-4) << dtype_name(dt) << " hd " << hd;
}

// KvFp8.PrefillAttention's cases: (heads, kv_heads, head_dim, page, (cached, new) per sequence,
// k_scale, v_scale), each run for e4m3 and e5m2.
struct Fp8AttnCase {
  int heads, kv_heads, hd, page;
  std::vector<std::pair<int, int>> seqs;
  float ks, vs;
};
inline std::vector<Fp8AttnCase> fp8_prefill_cases() {
  return {{32, 8, 128, 16, {{0, 77}, {50, 13}, {0, 1}, {200, 130}}, 1.0f, 1.0f},
          {5, 1, 64, 3, {{0, 200}, {31, 5}}, 0.37f, 2.5f},
          {4, 2, 32, 7, {{10, 64}, {0, 3}}, 3.0f, 0.5f},
          // The grouped kernels' fp8 staging over many tiles, groups 1 and 8.
          {8, 8, 128, 16, {{0, 300}, {700, 65}}, 0.37f, 2.5f},
          {16, 2, 128, 16, {{0, 1030}}, 1.0f, 1.0f}};
}

}  // namespace strata::parity
