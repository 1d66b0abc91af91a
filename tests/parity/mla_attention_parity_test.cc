// MLA on the GPU (backend/cuda/mla_attention.h) against the CPU reference (issue 22), through the
// kernels' launchers on raw device buffers laid out as KvLayout says (the backend wiring is tested
// with the models).
//
// What must hold and the bounds:
//  - the latent KV write stores the CPU's bytes (backend/kv_format.cc encode_k_row) for every row
//    format: bf16, fp8 e4m3 / e5m2 plain rows with unit and non-unit scales, rope-split rows (bf16,
//    fp8 and f32 rope parts), FlashMLA rows (tile scales computed on the device), for the three
//    built dims (512 + 64, 128 + 32, 32 + 8), with values that saturate, underflow and zero tiles;
//  - absorbed attention over identical caches (each side's write, equal bytes as above) against
//    CpuBackend::mla_attention: NMSE < 1e-4 for every layout. Both read the same stored values; the
//    GPU rounds P to bf16 (relative 2^-9 a weight) and its output to bf16, and FlashMLA values
//    times their tile scale, and f32 rope values, to bf16 (the per-layer scales stay in float32):
//    each ~1e-6-1e-5 of NMSE. Odd shapes: page sizes 1, 3, 16, 64; contexts off page bounds; 1, 5,
//    8, 16, 128 heads; 1..5 new tokens a sequence (causal among them), ragged batches, chunks of
//    64-200 new tokens (the prefill path); forced split counts (with empty splits) and the
//    automatic plan; the decode kernel where it applies (512 + 64 rows but f32 rope parts; 8 and
//    16 rows a block, one or two groups of S warps; its three e4m3 conversions; L2 prefetch 0, 1
//    (bf16's default), 2 and 6 chunks ahead; f16 Q, K, V and P over fp8 rows: P rounded to f16,
//    relative 2^-11; mla_decode_parity_test.cc), the mma.sync kernel
//    everywhere (both bf16 pipelines: 48-key chunks in 3 stages, 64 in 2) and the wgmma kernel
//    where it applies. Outputs start as NaN: a row not written fails the bound;
//  - a launch captured into a CUDA graph and replayed gives the eager launch's bits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "mla_attention_cases.h"

namespace strata::testing {
namespace {

using namespace mla_parity;

TEST(MlaAttention, KvWriteStoresTheCpuBytes) {
  std::mt19937 rng(3);
  const int dims[3][2] = {{512, 64}, {128, 32}, {32, 8}};
  for (const Fmt& f : kFormats) {
    for (const auto& d : dims) {
      const int page = 16, n = 300;
      const int64_t pages = (n + page - 1) / page + 3;
      std::vector<int32_t> slots(size_t(pages * page));
      std::iota(slots.begin(), slots.end(), 0);
      std::shuffle(slots.begin(), slots.end(), rng);
      slots.resize(n);
      auto rows = random_rows(n, d[0] + d[1], f.scale, rng, true);
      Caches c(f, d[0], d[1], pages, page, rows, slots);
      EXPECT_EQ(c.mismatched_bytes, 0) << f.name << " " << d[0] << "+" << d[1];
      std::printf("mla kv_write %-30s %3d+%-2d row %4lld bytes: %lld bytes differ from the CPU's\n",
                  f.name, d[0], d[1], (long long)c.fmt.row_bytes, (long long)c.mismatched_bytes);
    }
  }
  // Every finite bf16 value through the plain fp8 and bf16 encoders (512 + 64 rows).
  std::vector<float> all;
  for (uint32_t b = 0; b < 65536; ++b) {
    const float x = bf16_to_f32(uint16_t(b));
    all.push_back(std::isfinite(x) ? x : 0.0f);
  }
  const int64_t n = int64_t(all.size()) / 576 + 1;
  all.resize(size_t(n * 576), 1.0f);
  std::vector<int32_t> slots(static_cast<size_t>(n));
  std::iota(slots.begin(), slots.end(), 0);
  for (int i : {0, 2, 3, 4}) {
    Caches c(kFormats[i], 512, 64, n, 1, all, slots);
    EXPECT_EQ(c.mismatched_bytes, 0) << kFormats[i].name << " (all bf16 values)";
  }
}

// The pipelined kernel's row-tile pairs (128 heads, one new token a sequence, pages of a multiple
// of 16: a cluster of 2 CTAs fed by multicast TMA copies, boxes of 16 / 32 / 64 slots) against the
// CPU twin, with and without them: contexts that end inside a chunk (the rows past the end
// zeroed in shared memory; the batch's last sequence ends a box before its chunk does, where its
// page table has no entry), a sequence of one key, splits, a graph replay.
TEST(MlaAttention, RowTilePairs) {
  for (int mc : {1, 0}) {
    run_attention(kFormats[0], {.heads = 128,
                                .page = 16,
                                .seqs = {{1500, 1}, {63, 1}, {0, 1}, {127, 1}, {40, 1}},
                                .multicast = mc});
    run_attention(
        kFormats[0],
        {.heads = 128, .page = 64, .seqs = {{700, 1}, {129, 1}}, .splits = 4, .multicast = mc});
    run_attention(
        kFormats[0],
        {.heads = 128, .page = 32, .seqs = {{333, 1}, {64, 1}}, .splits = 3, .multicast = mc});
    run_attention(kFormats[0],
                  {.heads = 128, .page = 48, .seqs = {{200, 1}}, .graph = true, .multicast = mc});
  }
}

// 128 heads (DeepSeek-V3 at tp 1): both wgmma kernels (bf16), the decode kernel (8 row tiles a
// token) and the mma kernel.
TEST(MlaAttention, ManyHeads) {
  for (int wgmma : {2, 1}) {
    run_attention(kFormats[0],
                  {.heads = 128, .page = 16, .seqs = {{1500, 1}, {40, 1}, {0, 2}}, .wgmma = wgmma});
    run_attention(kFormats[0],
                  {.heads = 128, .page = 64, .seqs = {{700, 3}}, .wgmma = wgmma, .splits = 4});
  }
  run_attention(kFormats[0], {.heads = 128, .page = 1, .seqs = {{129, 1}, {300, 2}}, .wgmma = 0});
  run_attention(kFormats[0],
                {.heads = 128, .page = 1, .seqs = {{129, 1}, {300, 2}}, .wgmma = 0, .decode = 0});
  for (int i : {1, 5, 7}) {
    run_attention(kFormats[i], {.heads = 128, .page = 16, .seqs = {{900, 2}, {5, 1}}});
    run_attention(kFormats[i], {.heads = 128, .page = 16, .seqs = {{900, 2}}, .decode = 0});
  }
}

// Long new chunks (the absorbed prefill path), causal over earlier pages: 16, 5 and 3 heads, the
// pipelined wgmma kernel for bf16 (>= 64 rows; the wgmma kernel once), the decode or mma kernel
// for the rest.
TEST(MlaAttention, Chunks) {
  run_attention(kFormats[0], {.heads = 16, .page = 16, .seqs = {{0, 200}, {300, 70}}, .wgmma = 1});
  run_attention(kFormats[0], {.heads = 3, .page = 1, .seqs = {{2000, 50}, {0, 30}}});
  for (int i : {0, 1, 7}) {
    run_attention(kFormats[i], {.heads = 16, .page = 16, .seqs = {{0, 200}, {300, 70}, {5, 1}}});
    run_attention(kFormats[i], {.heads = 16, .page = 64, .seqs = {{1000, 65}}, .splits = 3});
  }
  run_attention(kFormats[0], {.heads = 16, .page = 16, .seqs = {{0, 130}}, .wgmma = 0});
  run_attention(kFormats[0],
                {.heads = 16, .page = 16, .seqs = {{0, 130}}, .wgmma = 0, .decode = 0});
  run_attention(kFormats[7], {.heads = 16, .page = 16, .seqs = {{0, 130}}, .decode = 0});
  run_attention(kFormats[0], {.heads = 5, .page = 3, .seqs = {{10, 90}, {0, 13}}});
}

// The mma kernel's other bf16 pipeline (64-key chunks, 2 stages).
TEST(MlaAttention, Bf16Chunk64) {
  run_attention(kFormats[0], {.heads = 16,
                              .page = 16,
                              .seqs = {{0, 1}, {700, 1}, {90, 3}},
                              .splits = 3,
                              .bf16_chunk = 64,
                              .decode = 0});
  run_attention(
      kFormats[0],
      {.latent = 128, .rope = 32, .heads = 5, .page = 1, .seqs = {{200, 2}}, .bf16_chunk = 64});
  run_attention(
      kFormats[0],
      {.heads = 128, .page = 64, .seqs = {{300, 1}}, .wgmma = 0, .bf16_chunk = 64, .decode = 0});
}

// The small dims: house-mla (128 + 32, 5 heads) and the tiny fixtures (32 + 8, 4 heads).
TEST(MlaAttention, SmallDims) {
  for (const Fmt& f : kFormats) {
    run_attention(
        f, {.latent = 128, .rope = 32, .heads = 5, .page = 3, .seqs = {{40, 1}, {0, 5}, {333, 2}}});
    run_attention(f, {.latent = 32,
                      .rope = 8,
                      .heads = 4,
                      .page = 1,
                      .seqs = {{70, 1}, {0, 9}, {128, 3}},
                      .splits = 2});
  }
}

// Draft trees (speculative verify with EAGLE topk > 1): each tree row sees the committed keys and
// its ancestors only. Every layout on the decode kernel (few rows) and the mma kernel; bf16 on both
// wgmma kernels (>= 64 rows); split-KV forced, so splits inside the new tokens see no key of a row.
TEST(MlaAttention, DraftTrees) {
  for (int decode : {1, 0}) {
    for (const Fmt& f : kFormats) {
      run_attention(f, {.heads = 16,
                        .page = 16,
                        .seqs = {{300, 8}, {0, 1}, {40, 5}, {1000, 1}},
                        .decode = decode,
                        .trees = true});
      run_attention(f, {.heads = 8,
                        .page = 1,
                        .seqs = {{130, 9}, {7, 2}},
                        .splits = 3,
                        .decode = decode,
                        .trees = true});
    }
  }
  for (int wgmma : {2, 1}) {
    run_attention(kFormats[0], {.heads = 16,
                                .page = 16,
                                .seqs = {{700, 64}, {3, 10}, {0, 70}},
                                .wgmma = wgmma,
                                .trees = true});
    run_attention(kFormats[0], {.heads = 128,
                                .page = 64,
                                .seqs = {{900, 6}, {50, 16}},
                                .wgmma = wgmma,
                                .splits = 4,
                                .trees = true});
  }
  run_attention(kFormats[0], {.heads = 16,
                              .page = 16,
                              .seqs = {{700, 64}, {3, 10}},
                              .wgmma = 0,
                              .decode = 0,
                              .trees = true});
}

TEST(MlaAttention, GraphReplay) {
  run_attention(kFormats[0], {.heads = 16, .page = 16, .seqs = {{600, 1}, {30, 1}}, .graph = true});
  run_attention(kFormats[0],
                {.heads = 16, .page = 16, .seqs = {{600, 1}}, .graph = true, .decode = 0});
  run_attention(kFormats[7],
                {.heads = 8, .page = 64, .seqs = {{600, 2}}, .splits = 4, .graph = true});
  run_attention(kFormats[0], {.heads = 128, .page = 16, .seqs = {{300, 1}}, .graph = true});
  run_attention(kFormats[0],
                {.heads = 128, .page = 16, .seqs = {{300, 1}}, .wgmma = 1, .graph = true});
}

}  // namespace
}  // namespace strata::testing
