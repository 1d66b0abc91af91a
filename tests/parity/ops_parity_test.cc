// CUDA op vs CPU reference on odd sizes. Inputs are random, rounded to bf16 so both backends see
// the same values; the CPU computes in float32, the GPU in bf16 with float32 accumulation.
// Error metric: NMSE = ‖gpu − cpu‖² / ‖cpu‖². Bounds: a bf16 rounding of the output alone gives
// about 1e-6; 1e-5 for one rounding of inputs to an op chain; attention's P·V in bf16 and long
// dot products get 1e-4. Every GPU output buffer is poisoned (NaN) first, so an element the
// kernel fails to write fails the test.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/attention_prefill_fa.h"
#include "backend/cuda/attention_prefill_split.h"
#include "backend/cuda/cuda_backend.h"

namespace strata {
namespace {

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
  std::mt19937& rng() { return rng_; }

  std::unique_ptr<Backend> cpu_, gpu_;

 private:
  std::mt19937 rng_;
};

struct LinearCase {
  int m, k, n;
  bool bias;
};

// out = x · wᵀ (+ bias) on both backends (bf16 weights on the GPU); returns the NMSE.
double linear_nmse(Pair& p, const LinearCase& c) {
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

TEST(CudaParity, Linear) {
  Pair p;
  for (LinearCase c : {LinearCase{1, 320, 129, false}, LinearCase{3, 896, 320, true}, LinearCase{8, 64, 517, false},
                       LinearCase{9, 320, 896, true}, LinearCase{77, 264, 1000, false}, LinearCase{5, 100, 33, true},
                       LinearCase{300, 4096, 1024, false}}) {
    const double e = linear_nmse(p, c);
    EXPECT_LT(e, 1e-5) << "m " << c.m << " k " << c.k << " n " << c.n;
    std::printf("linear m=%d k=%d n=%d bias=%d nmse %.3g\n", c.m, c.k, c.n, c.bias, e);
  }
}

// The decode GEMV with 1, 2 and 4 warps per output row (each sums its own 256-element blocks of
// k; the partial sums meet in shared memory): the 8B decode shapes and odd ones.
TEST(CudaParity, LinearSplitK) {
  Pair p;
  const bool mma0 = cuda::gemv_mma_enabled();
  cuda::set_gemv_mma_enabled(false);  // the FMA GEMV's variants (when on, the mma kernel takes m > 1)
  const int max_rows0 = cuda::gemv_max_rows();
  cuda::set_gemv_max_rows(cuda::kGemvMaxRows);  // every m <= 8 on the GEMV (default: m <= 2)
  for (int ks : {1, 2, 4}) {
    cuda::set_gemv_max_ksplit(ks);
    for (LinearCase c : {LinearCase{1, 4096, 4096, false}, LinearCase{1, 4096, 6144, false},
                         LinearCase{2, 14336, 4096, false}, LinearCase{3, 328, 1000, true},
                         LinearCase{1, 2056, 129, true}, LinearCase{8, 520, 77, false}}) {
      const double e = linear_nmse(p, c);
      EXPECT_LT(e, 1e-5) << "ksplit " << ks << " m " << c.m << " k " << c.k << " n " << c.n;
      std::printf("linear ksplit<=%d m=%d k=%d n=%d nmse %.3g\n", ks, c.m, c.k, c.n, e);
    }
  }
  cuda::set_gemv_max_ksplit(4);  // the default
  cuda::set_gemv_max_rows(max_rows0);
  cuda::set_gemv_mma_enabled(mma0);
}

// The tensor-core GEMV (linear_mma.cu) for every row count it serves (1..64: 1 to 8 n-tiles of 8
// tokens, partial ones included), k = 8 (one partial 32-element chunk), odd multiples of 8 (a
// tail after the 128-element blocks) and 4,096; odd n (a partial 16-row tile); with and without
// bias; each with 1, 2, 4 and 8 warps per tile (the k-split target picks: n = 2,113 is 133
// tiles, n = 1,001 63, on the H200's 132 SMs).
TEST(CudaParity, LinearMma) {
  Pair p;
  const bool mma0 = cuda::gemv_mma_enabled();
  const int per_sm0 = cuda::gemv_mma_warps_per_sm();
  const int min0 = cuda::gemv_mma_min_rows(), max0 = cuda::gemv_mma_max_rows();
  cuda::set_gemv_mma_enabled(true);
  cuda::set_gemv_mma_rows(1, cuda::kGemvMmaMaxRows);
  for (int per_sm : {1, 2, 4, 24}) {
    cuda::set_gemv_mma_warps_per_sm(per_sm);
    for (int m : {1, 2, 3, 5, 8, 9, 16, 17, 31, 32, 33, 64}) {
      for (LinearCase c : {LinearCase{m, 264, 2113, true}, LinearCase{m, 1000, 1001, false},
                           LinearCase{m, 8, 17, m % 2 == 1}, LinearCase{m, 4104, 77, m % 2 == 0}}) {
        const double e = linear_nmse(p, c);
        EXPECT_LT(e, 1e-5) << "warps/SM " << per_sm << " m " << c.m << " k " << c.k << " n " << c.n
                           << " bias " << c.bias;
        if (per_sm == 24 || e >= 1e-5)
          std::printf("linear mma warps/SM %d m=%d k=%d n=%d bias=%d nmse %.3g\n", per_sm, c.m, c.k,
                      c.n, c.bias, e);
      }
    }
  }
  // The 8B decode shapes at the default split.
  cuda::set_gemv_mma_warps_per_sm(per_sm0);
  for (int m : {8, 32}) {
    for (LinearCase c : {LinearCase{m, 4096, 6144, false}, LinearCase{m, 14336, 4096, false}}) {
      const double e = linear_nmse(p, c);
      EXPECT_LT(e, 1e-5) << "m " << c.m << " k " << c.k << " n " << c.n;
      std::printf("linear mma m=%d k=%d n=%d nmse %.3g\n", c.m, c.k, c.n, e);
    }
  }
  cuda::set_gemv_mma_rows(min0, max0);
  cuda::set_gemv_mma_enabled(mma0);
}

TEST(CudaParity, RmsNormAndResidual) {
  Pair p;
  for (auto [rows, dim] : {std::pair{7, 64}, {3, 320}, {5, 4096}, {2, 5000}, {40, 16}}) {
    auto x = p.make(p.random(int64_t(rows) * dim, 3.0f), {rows, dim});
    auto w = p.make(p.random(dim), {dim});
    auto out = p.out({rows, dim});
    p.cpu_->rms_norm(*x.cpu, *w.cpu, 1e-5f, *out.cpu);
    p.gpu_->rms_norm(*x.gpu, *w.gpu, 1e-5f, *out.gpu);
    EXPECT_LT(p.nmse(out), 1e-5) << rows << "x" << dim;

    auto res = p.make(p.random(int64_t(rows) * dim, 3.0f), {rows, dim});
    auto out2 = p.out({rows, dim});
    p.cpu_->add_rms_norm(*x.cpu, *res.cpu, *w.cpu, 1e-6f, *out2.cpu);
    p.gpu_->add_rms_norm(*x.gpu, *res.gpu, *w.gpu, 1e-6f, *out2.gpu);
    EXPECT_LT(p.nmse(out2), 1e-5) << "add_rms_norm " << rows << "x" << dim;
    EXPECT_LT(p.nmse(res), 1e-5) << "residual " << rows << "x" << dim;
  }
}

TEST(CudaParity, AddSiluMul) {
  Pair p;
  for (auto [rows, inter] : {std::pair{1, 896}, {13, 101}, {4, 14336}}) {
    auto a = p.make(p.random(int64_t(rows) * inter), {rows, inter});
    auto b = p.make(p.random(int64_t(rows) * inter), {rows, inter});
    auto sum = p.out({rows, inter});
    p.cpu_->add(*a.cpu, *b.cpu, *sum.cpu);
    p.gpu_->add(*a.gpu, *b.gpu, *sum.gpu);
    EXPECT_LT(p.nmse(sum), 1e-5);
    auto x = p.make(p.random(int64_t(rows) * 2 * inter, 2.0f), {rows, 2 * inter});
    auto out = p.out({rows, inter});
    p.cpu_->silu_mul(*x.cpu, *out.cpu);
    p.gpu_->silu_mul(*x.gpu, *out.gpu);
    EXPECT_LT(p.nmse(out), 1e-5) << rows << "x" << inter;
  }
}

TEST(CudaParity, RopeVariants) {
  Pair p;
  struct Case {
    int heads, stride, rotary, offset;
    bool interleaved;
    float factor;
  };
  for (Case c : {Case{5, 64, 64, 0, false, 1.0f}, Case{8, 128, 128, 0, true, 1.0f},
                 Case{3, 96, 32, 16, false, 1.3f}, Case{2, 48, 16, 32, true, 0.7f}}) {
    const int tokens = 37;
    std::vector<float> inv_freq(size_t(c.rotary / 2));
    for (int i = 0; i < c.rotary / 2; ++i)
      inv_freq[size_t(i)] = float(1.0 / std::pow(500000.0, 2.0 * i / c.rotary));
    std::vector<int32_t> pos(tokens);
    std::uniform_int_distribution<int32_t> d(0, 120000);
    for (auto& x : pos) x = d(p.rng());
    pos[0] = 0;
    auto x = p.make(p.random(int64_t(tokens) * c.heads * c.stride), {tokens, c.heads, c.stride});
    RopeArgs args{.inv_freq = inv_freq.data(), .attention_factor = c.factor, .rotary_dim = c.rotary,
                  .offset = c.offset, .interleaved = c.interleaved};
    p.cpu_->rope(*x.cpu, pos.data(), args);
    p.gpu_->rope(*x.gpu, pos.data(), args);
    const double e = p.nmse(x);
    EXPECT_LT(e, 1e-5) << "rotary " << c.rotary << " interleaved " << c.interleaved;
  }
}

TEST(CudaParity, CopiesEmbeddingGather) {
  Pair p;
  const int vocab = 1001, h = 72;
  auto table = p.make(p.random(int64_t(vocab) * h), {vocab, h});
  std::vector<int32_t> ids = {5, 1000, 0, 5, 777, 3};
  auto emb = p.out({int64_t(ids.size()), h});
  p.cpu_->embedding(ids.data(), int(ids.size()), *table.cpu, *emb.cpu);
  p.gpu_->embedding(ids.data(), int(ids.size()), *table.gpu, *emb.gpu);
  EXPECT_EQ(p.nmse(emb), 0.0);
  std::vector<int32_t> rows = {4, 0, 2};
  auto g = p.out({3, h});
  p.cpu_->gather_rows(*emb.cpu, rows.data(), 3, *g.cpu);
  p.gpu_->gather_rows(*emb.gpu, rows.data(), 3, *g.gpu);
  EXPECT_EQ(p.nmse(g), 0.0);
  auto s = p.out({int64_t(ids.size()), 29});
  p.cpu_->slice_columns(*emb.cpu, 13, 42, *s.cpu);
  p.gpu_->slice_columns(*emb.gpu, 13, 42, *s.gpu);
  EXPECT_EQ(p.nmse(s), 0.0);
  auto dst = p.make(p.random(int64_t(ids.size()) * 50), {int64_t(ids.size()), 50});
  p.cpu_->copy_columns(*emb.cpu, 8, 40, *dst.cpu, 17);
  p.gpu_->copy_columns(*emb.gpu, 8, 40, *dst.gpu, 17);
  EXPECT_EQ(p.nmse(dst), 0.0);
}

TEST(CudaParity, PerHeadLinear) {
  Pair p;
  const int tokens = 11, heads = 3, dx = 40, k = 24, n = 20, dout = 30;
  auto x = p.make(p.random(int64_t(tokens) * heads * dx), {tokens, heads, dx});
  auto w = p.make(p.random(int64_t(heads) * n * k, 0.2f), {heads, n, k});
  auto out = p.make(p.random(int64_t(tokens) * heads * dout), {tokens, heads, dout});
  p.cpu_->per_head_linear(*x.cpu, 8, *w.cpu, *out.cpu, 5);
  p.gpu_->per_head_linear(*x.gpu, 8, *w.gpu, *out.gpu, 5);
  EXPECT_LT(p.nmse(out), 1e-5);
}

// One attention problem: sequences with (cached, new) token counts, scrambled pages.
struct AttnCase {
  int heads, kv_heads, head_dim, page_size;
  std::vector<std::pair<int, int>> seqs;  // (cached, new)
};

void run_attention(const AttnCase& c) {
  Pair p;
  const int n = int(c.seqs.size());
  const int k_dim = c.kv_heads * c.head_dim;
  std::vector<int32_t> q_indptr{0}, kv_lens, page_indptr{0}, pages, positions, slots;
  std::vector<int32_t> all_slots;  // every context token, for filling the cache
  int64_t total_pages = 0;
  for (auto [cached, fresh] : c.seqs) total_pages += (cached + fresh + c.page_size - 1) / c.page_size;
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
  KvLayout lay{.num_layers = 1, .num_pages = int64_t(perm.size()), .page_size = c.page_size,
               .k_dim = k_dim, .v_dim = k_dim};
  KvLayout lay_cpu = lay, lay_gpu = lay;
  lay_cpu.dtype = DType::kF32;
  lay_gpu.dtype = DType::kBF16;
  auto kv_cpu = p.cpu_->alloc_kv(lay_cpu);
  auto kv_gpu = p.gpu_->alloc_kv(lay_gpu);
  // Fill every context token's K/V in one write.
  auto k = p.make(p.random(int64_t(t_all) * k_dim), {t_all, k_dim});
  auto v = p.make(p.random(int64_t(t_all) * k_dim), {t_all, k_dim});
  std::vector<int32_t> fill_pos(size_t(t_all), 0);
  AttentionMetadata fill{.num_seqs = 0, .num_tokens = t_all, .page_size = c.page_size,
                         .q_indptr = q_indptr.data(), .kv_lens = kv_lens.data(),
                         .page_indptr = page_indptr.data(), .page_indices = pages.data(),
                         .positions = fill_pos.data(), .slot_mapping = all_slots.data()};
  p.cpu_->kv_write(*kv_cpu, 0, *k.cpu, *v.cpu, fill);
  p.gpu_->kv_write(*kv_gpu, 0, *k.gpu, *v.gpu, fill);

  AttentionMetadata meta{.num_seqs = n, .num_tokens = t_new, .page_size = c.page_size,
                         .q_indptr = q_indptr.data(), .kv_lens = kv_lens.data(),
                         .page_indptr = page_indptr.data(), .page_indices = pages.data(),
                         .positions = positions.data(), .slot_mapping = slots.data()};
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
  EXPECT_LT(e, 1e-4) << "heads " << c.heads << "/" << c.kv_heads << " hd " << c.head_dim
                     << " page " << c.page_size;
  std::printf("attention heads %d/%d hd %d page %d seqs %d tokens %d: nmse %.3g\n", c.heads,
              c.kv_heads, c.head_dim, c.page_size, n, t_new, e);
}

TEST(CudaParity, DecodeAttention) {
  // One new token per sequence: the split-KV decode kernel.
  run_attention({32, 8, 128, 16, {{0, 1}, {16, 1}, {299, 1}, {1000, 1}, {4098, 1}}});
  run_attention({5, 1, 64, 3, {{7, 1}, {500, 1}}});
  run_attention({4, 4, 16, 4, {{33, 1}, {2, 1}, {129, 1}}});
  run_attention({4, 2, 32, 1, {{60, 1}}});
}

// Every prefill kernel variant of head_dim 64/128 (mma.sync; wgmma with 64- or 128-key tiles,
// with and without the overlapped P·V) runs each case; head_dim 16/32 take the simple kernel.
using cuda::kPrefillVariants;

// Scoped split-KV prefill mode (attention_prefill_split.h): the variant tests below pin the
// regular kernels (0), the split tests force (2) or auto-select (1) the split path.
class SplitMode {
 public:
  explicit SplitMode(int mode) : before_(cuda::prefill_split_mode()) { cuda::set_prefill_split_mode(mode); }
  ~SplitMode() { cuda::set_prefill_split_mode(before_); }

 private:
  int before_;
};

TEST(CudaParity, PrefillAttention) {
  // Ragged, chunked (cached tokens before the new ones), mixed with decodes.
  SplitMode regular(0);
  const cuda::PrefillVariant before = cuda::prefill_variant();
  for (auto v : kPrefillVariants) {
    cuda::set_prefill_variant(v);
    std::printf("prefill kernel %s\n", cuda::prefill_variant_name(v));
    run_attention({32, 8, 128, 16, {{0, 77}, {50, 13}, {0, 1}, {200, 130}}});
    run_attention({5, 1, 64, 3, {{0, 200}, {31, 5}}});
  }
  cuda::set_prefill_variant(before);
  run_attention({4, 4, 16, 4, {{0, 65}, {100, 1}}});
  run_attention({4, 2, 32, 7, {{10, 64}, {0, 3}}});
}

TEST(CudaParity, PrefillAttentionTiles) {
  // The pipelined GQA kernels (head_dim 64/128): a block is 128 query rows = 128 / group tokens,
  // K/V tiles of 64 or 128 keys. Group sizes 1, 3 (rows not a multiple of the group), 4, 8, 16;
  // chunk lengths around the tile edges (63/64/65/128 new tokens, contexts on and off tile
  // edges); a long chunked context (many tiles: the double buffer and slot table wrap).
  SplitMode regular(0);
  const cuda::PrefillVariant before = cuda::prefill_variant();
  for (auto v : kPrefillVariants) {
    cuda::set_prefill_variant(v);
    std::printf("prefill kernel %s\n", cuda::prefill_variant_name(v));
    run_attention({8, 8, 128, 16, {{0, 300}, {129, 128}, {64, 64}}});
    run_attention({6, 2, 64, 5, {{0, 100}, {37, 43}, {0, 1}}});
    run_attention({8, 2, 128, 16, {{64, 64}, {0, 63}, {128, 65}, {1, 128}, {63, 1}, {256, 129}}});
    run_attention({32, 4, 128, 16, {{0, 257}, {1000, 17}}});
    run_attention({16, 1, 64, 8, {{0, 40}, {5, 9}, {3000, 2}}});
    run_attention({32, 8, 128, 16, {{1500, 700}}});
  }
  cuda::set_prefill_variant(before);
}

TEST(CudaParity, PrefillAttentionSplitKv) {
  // Split-KV prefill (attention_prefill_split.cu): a block is 64 query rows = 64 / group tokens
  // over one split of the keys; splits of >= 256 keys (multiples of 64) merge in a second
  // kernel. Forced on (mode 2), so short contexts take it too: one-split tiles write the output
  // directly. Short chunks over long contexts (the rows' positions fall in different splits, so
  // some splits see no key of a row), chunk lengths around the 16-token tile edge of group 4,
  // ragged batches mixing such chunks with fresh prompts and decodes, groups 1, 3, 4, 8, 16,
  // head_dim 64/128, odd page sizes, scrambled pages. Bound: NMSE < 1e-4, as the other kernels.
  {
    SplitMode forced(2);
    run_attention({32, 8, 128, 16, {{5000, 16}}});
    run_attention({32, 8, 128, 16, {{3000, 16}, {0, 77}, {4000, 1}, {200, 130}, {2500, 64}}});
    run_attention({32, 8, 128, 16, {{1000, 15}, {1001, 17}, {999, 256}, {64, 16}}});
    run_attention({6, 2, 64, 5, {{2100, 7}, {0, 40}, {33, 1}}});
    run_attention({8, 8, 128, 16, {{3000, 33}, {10, 64}}});
    run_attention({16, 1, 64, 8, {{4100, 9}, {10, 3}}});
    run_attention({32, 2, 128, 16, {{700, 5}, {0, 300}}});
    run_attention({32, 8, 128, 16, {{0, 77}, {50, 13}, {0, 1}, {200, 130}}});
    run_attention({5, 1, 64, 3, {{0, 200}, {31, 5}}});
  }
  // Auto (the default): a short chunk over a long context takes the split path, mixed with a
  // fresh prompt; a long fresh prompt alone stays on the regular kernels.
  SplitMode automatic(1);
  run_attention({32, 8, 128, 16, {{8000, 16}, {0, 100}}});
  run_attention({32, 8, 128, 16, {{6000, 64}}});
  run_attention({32, 8, 128, 16, {{0, 2500}}});
}

}  // namespace
}  // namespace strata
