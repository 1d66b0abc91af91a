// CUDA op vs CPU reference on odd sizes. Inputs are random, rounded to bf16 so both backends see
// the same values; the CPU computes in float32, the GPU in bf16 with float32 accumulation.
// Error metric: NMSE = ‖gpu − cpu‖² / ‖cpu‖². Bounds: a bf16 rounding of the output alone gives
// about 1e-6; 1e-5 for one rounding of inputs to an op chain; attention's P·V in bf16 and long
// dot products get 1e-4. Every GPU output buffer is poisoned (NaN) first, so an element the
// kernel fails to write fails the test.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/attention.h"
#include "backend/cuda/cuda_backend.h"
#include "parity/op_pair.h"

namespace strata {
namespace {

using parity::AttnCase;
using parity::linear_nmse;
using parity::LinearCase;
using parity::Pair;
using parity::run_attention;

TEST(CudaParity, Linear) {
  Pair p;
  for (LinearCase c : {LinearCase{1, 320, 129, false}, LinearCase{3, 896, 320, true},
                       LinearCase{8, 64, 517, false}, LinearCase{9, 320, 896, true},
                       LinearCase{77, 264, 1000, false}, LinearCase{5, 100, 33, true},
                       LinearCase{300, 4096, 1024, false}}) {
    const double e = linear_nmse(p, c);
    EXPECT_LT(e, 1e-5) << "m " << c.m << " k " << c.k << " n " << c.n;
    std::printf("linear m=%d k=%d n=%d bias=%d nmse %.3g\n", c.m, c.k, c.n, c.bias, e);
  }
}

// Deterministic mode: every linear on the batch-invariant GEMM (linear_det.h; k a multiple of 8).
TEST(CudaParity, LinearDeterministic) {
  Pair p;
  p.cuda().tune([](cuda::CudaTunables& t) { t.deterministic = true; });
  for (LinearCase c : {LinearCase{1, 320, 129, false}, LinearCase{3, 896, 320, true},
                       LinearCase{9, 320, 896, true}, LinearCase{77, 264, 1000, false},
                       LinearCase{300, 4096, 1024, false}}) {
    const double e = linear_nmse(p, c);
    EXPECT_LT(e, 1e-5) << "m " << c.m << " k " << c.k << " n " << c.n;
    std::printf("linear deterministic m=%d k=%d n=%d bias=%d nmse %.3g\n", c.m, c.k, c.n, c.bias,
                e);
  }
}

// The decode GEMV with 1, 2 and 4 warps per output row (each sums its own 256-element blocks of
// k; the partial sums meet in shared memory): the 8B decode shapes and odd ones.
TEST(CudaParity, LinearSplitK) {
  Pair p;
  for (int ks : {1, 2, 4}) {
    p.cuda().tune([&](cuda::CudaTunables& t) {
      t.gemv_max_rows = cuda::kGemvMaxRows;  // every m <= 8 on the GEMV (default: m <= 2)
      t.gemv_max_ksplit = ks;
    });
    for (LinearCase c : {LinearCase{1, 4096, 4096, false}, LinearCase{1, 4096, 6144, false},
                         LinearCase{2, 14336, 4096, false}, LinearCase{3, 328, 1000, true},
                         LinearCase{1, 2056, 129, true}, LinearCase{8, 520, 77, false}}) {
      const double e = linear_nmse(p, c);
      EXPECT_LT(e, 1e-5) << "ksplit " << ks << " m " << c.m << " k " << c.k << " n " << c.n;
      std::printf("linear ksplit<=%d m=%d k=%d n=%d nmse %.3g\n", ks, c.m, c.k, c.n, e);
    }
  }
}

// Every row kernel (the warp, block and 16-byte row kernels, dims to 24,576: one to three
// 16-byte chunks a thread), with the row kernel's bf16 weights loaded after and before its PDL
// wait (CudaTunables::norm_weight_preload): within bf16 tolerance of the CPU, and the same bits
// either way.
TEST(CudaParity, RmsNormAndResidual) {
  Pair p;
  for (auto [rows, dim] : {std::pair{7, 64},
                           {3, 320},
                           {5, 4096},
                           {2, 5000},
                           {40, 16},
                           {3, 7168},
                           {2, 16384},
                           {1, 24576}}) {
    auto x = p.make(p.random(int64_t(rows) * dim, 3.0f), {rows, dim});
    auto w = p.make(p.random(dim), {dim});
    const auto res0 = p.random(int64_t(rows) * dim, 3.0f);
    std::vector<float> outs[2], adds[2];
    for (bool preload : {false, true}) {
      p.cuda().tune([&](cuda::CudaTunables& t) { t.norm_weight_preload = preload; });
      const std::string at = std::to_string(rows) + "x" + std::to_string(dim) +
                             (preload ? " weights before the wait" : "");
      auto out = p.out({rows, dim});
      p.cpu_->rms_norm(*x.cpu, *w.cpu, 1e-5f, *out.cpu);
      p.gpu_->rms_norm(*x.gpu, *w.gpu, 1e-5f, *out.gpu);
      EXPECT_LT(p.nmse(out), 1e-5) << at;
      outs[preload] = p.get(*out.gpu, true);

      auto res = p.make(res0, {rows, dim});
      auto out2 = p.out({rows, dim});
      p.cpu_->add_rms_norm(*x.cpu, *res.cpu, *w.cpu, 1e-6f, *out2.cpu);
      p.gpu_->add_rms_norm(*x.gpu, *res.gpu, *w.gpu, 1e-6f, *out2.gpu);
      EXPECT_LT(p.nmse(out2), 1e-5) << "add_rms_norm " << at;
      EXPECT_LT(p.nmse(res), 1e-5) << "residual " << at;
      adds[preload] = p.get(*out2.gpu, true);
    }
    EXPECT_EQ(outs[0], outs[1]) << rows << "x" << dim;
    EXPECT_EQ(adds[0], adds[1]) << "add_rms_norm " << rows << "x" << dim;
  }
}

// In place over each row's first columns (MLA's latent inside its [latent | rope] cache row):
// against the CPU reference, bit for bit the GPU's own default (slice_columns, rms_norm,
// copy_columns: the same kernel on a contiguous copy), the other columns untouched. Strides that
// are multiples of 8 take the vectorized kernel, others the scalar ones.
TEST(CudaParity, RmsNormColumns) {
  Pair p;
  struct Case {
    int rows, cols, dim;
  };
  for (Case c : {Case{1, 576, 512}, Case{7, 576, 512}, Case{3, 80, 64}, Case{2, 1000, 600},
                 Case{5, 1001, 700}, Case{4, 333, 300}}) {
    const std::vector<float> xv = p.random(int64_t(c.rows) * c.cols, 3.0f);
    auto x = p.make(xv, {c.rows, c.cols});
    auto w = p.make(p.random(c.dim), {c.dim});
    p.cpu_->rms_norm_columns(*x.cpu, *w.cpu, 1e-6f);
    p.gpu_->rms_norm_columns(*x.gpu, *w.gpu, 1e-6f);
    EXPECT_LT(p.nmse(x), 1e-5) << c.rows << "x" << c.cols << " dim " << c.dim;
    auto ref = p.make(xv, {c.rows, c.cols});
    p.gpu_->Backend::rms_norm_columns(*ref.gpu, *w.gpu, 1e-6f);
    const std::vector<float> got = p.get(*x.gpu, true), want = p.get(*ref.gpu, true);
    int differ = 0, moved = 0;
    for (int r = 0; r < c.rows; ++r)
      for (int col = 0; col < c.cols; ++col) {
        const size_t i = size_t(r) * c.cols + col;
        differ += std::memcmp(&got[i], &want[i], sizeof(float)) != 0;
        if (col >= c.dim) moved += std::memcmp(&got[i], &xv[i], sizeof(float)) != 0;
      }
    EXPECT_EQ(differ, 0) << "values differing from the unfused path, " << c.rows << "x" << c.cols;
    EXPECT_EQ(moved, 0) << "columns past dim changed, " << c.rows << "x" << c.cols;
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
    RopeArgs args{.inv_freq = inv_freq.data(),
                  .attention_factor = c.factor,
                  .rotary_dim = c.rotary,
                  .offset = c.offset,
                  .interleaved = c.interleaved};
    p.cpu_->rope(*x.cpu, pos.data(), args);
    p.gpu_->rope(*x.gpu, pos.data(), args);
    const double e = p.nmse(x);
    EXPECT_LT(e, 1e-5) << "rotary " << c.rotary << " interleaved " << c.interleaved;
  }
}

// Graph mode merges rope(a) and rope(b) with the same positions into one launch, each tensor at
// its own offset (MLA: the cache row's rope part at 512, q's at 128; deepseek.cc orders them so).
TEST(CudaParity, RopeMergedAtTwoOffsets) {
  Pair p;
  for (bool interleaved : {false, true}) {
    const int tokens = 5, heads = 3, rotary = 64;
    std::vector<float> inv_freq(size_t(rotary / 2));
    for (int i = 0; i < rotary / 2; ++i)
      inv_freq[size_t(i)] = float(1.0 / std::pow(10000.0, 2.0 * i / rotary));
    std::vector<int32_t> pos = {0, 7, 4000, 65000, 3};
    auto row = p.make(p.random(int64_t(tokens) * 576), {tokens, 1, 576});
    auto q = p.make(p.random(int64_t(tokens) * heads * 192), {tokens, heads, 192});
    RopeArgs a{.inv_freq = inv_freq.data(),
               .attention_factor = 1.2f,
               .rotary_dim = rotary,
               .offset = 512,
               .interleaved = interleaved};
    RopeArgs b = a;
    b.offset = 128;
    p.cuda().set_graph_mode(true);
    for (Backend* be : {p.cpu_.get(), p.gpu_.get()}) {
      const bool gpu = be == p.gpu_.get();
      be->rope(gpu ? *row.gpu : *row.cpu, pos.data(), a);
      be->rope(gpu ? *q.gpu : *q.cpu, pos.data(), b);
    }
    EXPECT_LT(p.nmse(row), 1e-5) << "cache row, interleaved " << interleaved;  // ends the step
    EXPECT_LT(p.nmse(q), 1e-5) << "q, interleaved " << interleaved;
    p.cuda().set_graph_mode(false);
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

// One per_head_linear (out[:, h, out_begin..] = x[:, h, x_begin..] · w[h]ᵀ) on both backends:
// the NMSE of the GPU's output.
struct PerHeadCase {
  int heads, dx, x_begin, k, n, dout, out_begin;
};
double per_head_nmse(Pair& p, int tokens, const PerHeadCase& c) {
  auto x = p.make(p.random(int64_t(tokens) * c.heads * c.dx), {tokens, c.heads, c.dx});
  auto w = p.make(p.random(int64_t(c.heads) * c.n * c.k, 0.2f), {c.heads, c.n, c.k});
  auto out = p.make(p.random(int64_t(tokens) * c.heads * c.dout), {tokens, c.heads, c.dout});
  p.cpu_->per_head_linear(*x.cpu, c.x_begin, *w.cpu, *out.cpu, c.out_begin);
  p.gpu_->per_head_linear(*x.gpu, c.x_begin, *w.gpu, *out.gpu, c.out_begin);
  return p.nmse(out);
}

// Up to 8 tokens the per-head GEMV (per_head_gemv.h), above (and with the GEMV off) cuBLAS's
// batched GEMM: odd sizes at column offsets, and MLA's W_UK (q_nope [.., 192] -> latent columns
// of [.., 576]) and W_UV (latent 512 -> v 128) with 8 heads (a Kimi-K2.5 rank of tp 8).
TEST(CudaParity, PerHeadLinear) {
  Pair p;
  for (int gemv_max : {8, 0}) {
    p.cuda().tune([&](cuda::CudaTunables& t) { t.per_head_gemv_max_tokens = gemv_max; });
    for (int tokens : {1, 3, 8, 11}) {
      for (PerHeadCase c :
           {PerHeadCase{3, 40, 8, 24, 20, 30, 5}, PerHeadCase{8, 192, 0, 128, 512, 576, 0},
            PerHeadCase{8, 512, 0, 512, 128, 128, 0}, PerHeadCase{2, 20, 3, 17, 9, 12, 1}}) {
        const double e = per_head_nmse(p, tokens, c);
        EXPECT_LT(e, 1e-5) << "gemv up to " << gemv_max << " tokens " << tokens << " heads "
                           << c.heads << " k " << c.k << " n " << c.n;
        std::printf("per_head_linear gemv<=%d tokens %d heads %d k %d n %d: nmse %.3g\n", gemv_max,
                    tokens, c.heads, c.k, c.n, e);
      }
    }
  }
}

// The same op in deterministic mode: the batch-invariant GEMM (linear_det.h), one head per grid z,
// on the shapes it takes (k, offsets and strides multiples of 8): MLA's W_UK and W_UV.
TEST(CudaParity, PerHeadLinearDeterministic) {
  Pair p;
  p.cuda().tune([](cuda::CudaTunables& t) { t.deterministic = true; });
  for (int tokens : {1, 3, 8, 11, 70}) {
    for (PerHeadCase c :
         {PerHeadCase{8, 192, 0, 128, 512, 576, 0}, PerHeadCase{8, 512, 0, 512, 128, 128, 0},
          PerHeadCase{2, 48, 16, 32, 24, 40, 8}}) {
      const double e = per_head_nmse(p, tokens, c);
      EXPECT_LT(e, 1e-5) << "tokens " << tokens << " heads " << c.heads << " k " << c.k << " n "
                         << c.n;
      std::printf("per_head_linear deterministic tokens %d heads %d k %d n %d: nmse %.3g\n", tokens,
                  c.heads, c.k, c.n, e);
    }
  }
}

TEST(CudaParity, DecodeAttention) {
  // One new token per sequence: the split-KV decode kernel, its old keys copied after its PDL
  // wait (decode_early_kv off; the default's copies before it: DecodeAttentionEarlyKv).
  const auto plain = [](cuda::CudaBackend& be) {
    be.tune([](cuda::CudaTunables& t) { t.decode_early_kv = false; });
  };
  run_attention({32, 8, 128, 16, {{0, 1}, {16, 1}, {299, 1}, {1000, 1}, {4098, 1}}}, plain);
  run_attention({5, 1, 64, 3, {{7, 1}, {500, 1}}}, plain);
  run_attention({4, 4, 16, 4, {{33, 1}, {2, 1}, {129, 1}}}, plain);
  run_attention({4, 2, 32, 1, {{60, 1}}}, plain);
}

// The decode kernel with its first chunks of old keys copied before its PDL wait
// (CudaTunables::decode_early_kv, the default): new tokens in a split's first, second and later
// 64-key chunk, on a chunk's first and last key, one split and several.
TEST(CudaParity, DecodeAttentionEarlyKv) {
  const auto early = [](cuda::CudaBackend& be) {
    be.tune([](cuda::CudaTunables& t) { t.decode_early_kv = true; });
  };
  run_attention({32, 8, 128, 16, {{0, 1}, {63, 1}, {64, 1}, {127, 1}, {128, 1}, {299, 1}}}, early);
  run_attention({32, 8, 128, 16, {{1000, 1}, {4098, 1}, {191, 1}}}, early);
  run_attention({5, 1, 64, 3, {{7, 1}, {500, 1}}}, early);
  run_attention({4, 4, 16, 4, {{33, 1}, {2, 1}, {129, 1}}}, early);
}

// Decode splits of at least 1,024 keys (CudaTunables::decode_min_split_tokens; variant
// decode_split_tokens1024): one block walks a whole context of up to 1,024 keys (16 chunks, the
// new token's row in a chunk the early copies do not reach) and writes the output itself.
TEST(CudaParity, DecodeAttentionSplitFloor) {
  const auto floor1024 = [](cuda::CudaBackend& be) {
    be.tune([](cuda::CudaTunables& t) { t.decode_min_split_tokens = 1024; });
  };
  run_attention({32, 8, 128, 16, {{1000, 1}, {300, 1}, {4098, 1}, {63, 1}}}, floor1024);
  run_attention({5, 1, 64, 3, {{900, 1}, {7, 1}}}, floor1024);
}

// Decode's split counts (plan_decode_splits) on 132 SMs, 64-key iterations: the fewest splits
// that give every SM a block, a second round filled where the first overflows, four blocks an SM
// once one split overflows the SMs, the floor of 64 keys a split, the bucket's rounding; and the
// rule before 2026-12-07 (four blocks an SM at every batch).
TEST(CudaParity, DecodeSplitPlan) {
  const auto plan = [](int64_t seqs, int kv_heads, int64_t max_kv, const cuda::CudaTunables& rule) {
    const cuda::DecodeSplitPlan p = cuda::plan_decode_splits(seqs, kv_heads, max_kv, 132, 64, rule);
    return std::pair{p.splits, p.split_len};
  };
  const cuda::CudaTunables now;
  using P = std::pair<int, int>;
  EXPECT_EQ(plan(1, 8, 512, now), P(8, 64));     // 17 wanted, 512 / 64 at most
  EXPECT_EQ(plan(1, 8, 100, now), P(4, 64));     // bucket 256
  EXPECT_EQ(plan(1, 8, 2048, now), P(16, 128));  // 17 -> 121 keys -> 128: 16 splits, 128 blocks
  EXPECT_EQ(plan(1, 8, 4096, now), P(16, 256));
  EXPECT_EQ(plan(1, 8, 16384, now), P(16, 1024));
  EXPECT_EQ(plan(1, 4, 4096, now), P(32, 128));   // 33 -> 125 -> 128 keys
  EXPECT_EQ(plan(4, 8, 4096, now), P(8, 512));    // 5 (160 blocks) -> two rounds: 8
  EXPECT_EQ(plan(3, 8, 4096, now), P(11, 384));   // 6 (144 blocks) -> 11 (264)
  EXPECT_EQ(plan(16, 8, 2048, now), P(2, 1024));  // 256 blocks: already two rounds
  EXPECT_EQ(plan(17, 8, 2048, now), P(4, 512));   // 136 blocks a split: four an SM, 544
  EXPECT_EQ(plan(48, 8, 2048, now), P(2, 1024));  // 384 -> 768 blocks
  EXPECT_EQ(plan(64, 8, 2048, now), P(1, 2048));  // 512 blocks: 90% of four an SM
  cuda::CudaTunables old;                         // decode_old_splits
  old.decode_blocks_per_sm = 4;
  old.decode_large_batch_blocks_per_sm = 4;
  old.decode_split_fill_second_round = false;
  EXPECT_EQ(plan(1, 8, 4096, old), P(64, 64));    // 66 wanted, 64 at most
  EXPECT_EQ(plan(16, 8, 2048, old), P(5, 448));   // 5 -> 410 -> 448 keys
  EXPECT_EQ(plan(4, 8, 4096, old), P(16, 256));   // 17 -> 241 -> 256 keys: 16
  EXPECT_EQ(plan(64, 8, 2048, old), P(2, 1024));  // 528 blocks wanted, 512 a split
}

// The split-KV prefill mode (CudaTunables::prefill_split_mode): the regular kernels' tests pin
// 0, the split tests force 2 or auto-select (1).
std::function<void(cuda::CudaBackend&)> split_mode(int mode) {
  return [mode](cuda::CudaBackend& be) {
    be.tune([&](cuda::CudaTunables& t) { t.prefill_split_mode = mode; });
  };
}

// Prefill: head_dim 64/128 take the grouped wgmma kernel (64-key tiles; 3 stages for bf16 KV at
// head_dim 64, else 2), head_dim 16/32 the simple kernel. The kernel variants the product does
// not run: bench/cuda/dev/dev_parity_test.cc.
TEST(CudaParity, PrefillAttention) {
  // Ragged, chunked (cached tokens before the new ones), mixed with decodes.
  const auto regular = split_mode(0);
  run_attention({32, 8, 128, 16, {{0, 77}, {50, 13}, {0, 1}, {200, 130}}}, regular);
  run_attention({5, 1, 64, 3, {{0, 200}, {31, 5}}}, regular);
  run_attention({4, 4, 16, 4, {{0, 65}, {100, 1}}}, regular);
  run_attention({4, 2, 32, 7, {{10, 64}, {0, 3}}}, regular);
}

TEST(CudaParity, PrefillAttentionTiles) {
  // The grouped GQA kernel (head_dim 64/128): a block is 128 query rows = 128 / group tokens,
  // K/V tiles of 64 keys. Group sizes 1, 3 (rows not a multiple of the group), 4, 8, 16; chunk
  // lengths around the tile edges (63/64/65/128 new tokens, contexts on and off tile edges); a
  // long chunked context (many tiles: the stage buffers and slot table wrap).
  for (const AttnCase& c : parity::prefill_tile_cases()) run_attention(c, split_mode(0));
}

TEST(CudaParity, PrefillAttentionSplitKv) {
  // Split-KV prefill (attention_prefill_split.cu): a block is 64 query rows = 64 / group tokens
  // over one split of the keys; splits of >= 256 keys (multiples of 64) merge in a second
  // kernel. Forced on (mode 2), so short contexts take it too: one-split tiles write the output
  // directly. Short chunks over long contexts (the rows' positions fall in different splits, so
  // some splits see no key of a row), chunk lengths around the 16-token tile edge of group 4,
  // ragged batches mixing such chunks with fresh prompts and decodes, groups 1, 3, 4, 8, 16,
  // head_dim 64/128, odd page sizes, scrambled pages. Bound: NMSE < 1e-4, as the other kernels.
  const auto forced = split_mode(2);
  run_attention({32, 8, 128, 16, {{5000, 16}}}, forced);
  run_attention({32, 8, 128, 16, {{3000, 16}, {0, 77}, {4000, 1}, {200, 130}, {2500, 64}}}, forced);
  run_attention({32, 8, 128, 16, {{1000, 15}, {1001, 17}, {999, 256}, {64, 16}}}, forced);
  run_attention({6, 2, 64, 5, {{2100, 7}, {0, 40}, {33, 1}}}, forced);
  run_attention({8, 8, 128, 16, {{3000, 33}, {10, 64}}}, forced);
  run_attention({16, 1, 64, 8, {{4100, 9}, {10, 3}}}, forced);
  run_attention({32, 2, 128, 16, {{700, 5}, {0, 300}}}, forced);
  run_attention({32, 8, 128, 16, {{0, 77}, {50, 13}, {0, 1}, {200, 130}}}, forced);
  run_attention({5, 1, 64, 3, {{0, 200}, {31, 5}}}, forced);
  // Auto (the default): a short chunk over a long context takes the split path, mixed with a
  // fresh prompt; a long fresh prompt alone stays on the regular kernels.
  const auto automatic = split_mode(1);
  run_attention({32, 8, 128, 16, {{8000, 16}, {0, 100}}}, automatic);
  run_attention({32, 8, 128, 16, {{6000, 64}}}, automatic);
  run_attention({32, 8, 128, 16, {{0, 2500}}}, automatic);
}

}  // namespace
}  // namespace strata
