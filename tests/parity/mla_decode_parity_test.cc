// The MLA decode kernel (backend/cuda/mla_decode.cuh) against the CPU reference through
// mla_attention_cases.h's run_attention (the bounds: mla_attention_parity_test.cc's header): every
// row layout, its own split merge, capped and planned splits, 8- and 16-row blocks, its e4m3
// conversions and V tile, its S forms (two groups of S warps), L2 prefetch distances and row
// groups.
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

// Decode (one new token a sequence) and speculative-verify shapes over every layout, the real
// dims, the decode kernel where it applies (else the mma kernel): 16 heads (Moonlight / V2-Lite),
// 8 (Kimi tp8: 8-row blocks), 1; split-KV forced and automatic; page sizes 1, 16, 64; then the
// mma kernel on the same shapes.
TEST(MlaAttention, DecodeEveryLayout) {
  for (int decode : {1, 0}) {
    for (const Fmt& f : kFormats) {
      run_attention(f, {.heads = 16,
                        .page = 16,
                        .seqs = {{0, 1}, {16, 1}, {299, 1}, {1000, 1}},
                        .decode = decode});
      run_attention(
          f, {.heads = 8, .page = 64, .seqs = {{2100, 1}, {63, 1}}, .splits = 5, .decode = decode});
      run_attention(
          f, {.heads = 1, .page = 1, .seqs = {{130, 3}, {7, 2}}, .splits = 3, .decode = decode});
      run_attention(
          f, {.heads = 16, .page = 16, .seqs = {{500, 5}, {0, 4}, {77, 1}}, .decode = decode});
    }
  }
}

// The decode kernel's own split merge (MlaPlanOptions::fused_merge): the last split block of a
// tile merges the others' partials. Forced and planned splits (2 to 64: a lane weighs two), 8-
// and 16-row tiles, ragged batches with sequences shorter than their splits (empty splits weigh
// 0), a sequence with no keys before its token, bf16, e4m3 and FlashMLA rows, graph replay (the
// counters must be zero again after every launch).
TEST(MlaAttention, DecodeFusedMerge) {
  for (int i : {0, 2, 7}) {  // bf16, e4m3 with a scale, FlashMLA
    const Fmt& f = kFormats[i];
    run_attention(f, {.heads = 16,
                      .page = 16,
                      .seqs = {{0, 1}, {16, 1}, {299, 1}, {1000, 1}},
                      .graph = true,
                      .fused_merge = cuda::kMlaFusedMergeMaxSplits});
    run_attention(f, {.heads = 8,
                      .page = 64,
                      .seqs = {{2100, 1}, {63, 1}},
                      .splits = 5,
                      .graph = true,
                      .fused_merge = cuda::kMlaFusedMergeMaxSplits});
    run_attention(f, {.heads = 8,
                      .page = 64,
                      .seqs = {{4095, 1}},
                      .splits = 64,
                      .fused_merge = cuda::kMlaFusedMergeMaxSplits});
    run_attention(f, {.heads = 16,
                      .page = 64,
                      .seqs = {{767, 1}},
                      .decode_rows = 8,
                      .graph = true,
                      .fused_merge = cuda::kMlaFusedMergeMaxSplits});
    run_attention(f, {.heads = 16,
                      .page = 16,
                      .seqs = {{500, 5}, {0, 4}, {77, 1}},
                      .wgmma = 0,
                      .splits = 3,
                      .fused_merge = cuda::kMlaFusedMergeMaxSplits});
  }
}

// The plan's splits capped (CudaTunables::mla_max_splits): a Kimi-K2.5 rank's batch 1 (8 heads, a
// 4,096-token context) in 16 splits of 4 chunks instead of 64 of one, and a batch of two.
TEST(MlaAttention, DecodeCappedSplits) {
  const Fmt& bf16 = kFormats[0];
  const cuda::MlaRowFormat fmt = cuda::mla_row_format(make_layout(bf16, 512, 64, 64, 64), 1, 1.0f);
  const cuda::MlaPlan capped =
      cuda::plan_mla_attention(fmt, 1, 1, 8, 1, 4096, 132, {.max_splits = 16});
  EXPECT_EQ(capped.num_splits, 16);
  EXPECT_EQ(capped.split_len, 4 * capped.chunk);
  const cuda::MlaPlan plain = cuda::plan_mla_attention(fmt, 1, 1, 8, 1, 4096, 132);
  EXPECT_EQ(plain.num_splits, 4096 / plain.chunk);
  // CudaTunables::mla_min_split_chunks: two chunks a split (32 splits at 4,096 keys); a shorter
  // context keeps one chunk a split (kMlaSplitsKept); a long one stays split wide (132 blocks).
  const cuda::MlaPlan two =
      cuda::plan_mla_attention(fmt, 1, 1, 8, 1, 4096, 132, {.min_split_chunks = 2});
  EXPECT_EQ(two.num_splits, 32);
  EXPECT_EQ(two.split_len, 2 * two.chunk);
  EXPECT_EQ(cuda::plan_mla_attention(fmt, 1, 1, 8, 1, 768, 132, {.min_split_chunks = 2}).num_splits,
            12);
  EXPECT_GE(
      cuda::plan_mla_attention(fmt, 1, 1, 8, 1, 32768, 132, {.min_split_chunks = 2}).num_splits,
      128);
  for (int cap : {16, 3})
    for (const Fmt* f : {&bf16, &kFormats[std::size(kFormats) - 1]}) {
      run_attention(*f, {.heads = 8, .page = 64, .seqs = {{4095, 1}}, .max_splits = cap});
      run_attention(*f,
                    {.heads = 16, .page = 16, .seqs = {{1000, 1}, {299, 1}}, .max_splits = cap});
    }
}

// The decode kernel in blocks of 8 query rows where the plan would take 16
// (CudaTunables::mla_decode_rows): 16 heads (Moonlight at batch 1) in two row tiles, 5 heads of 4
// new tokens (20 rows: three tiles, the last short), every row layout.
TEST(MlaAttention, DecodeEightRowTiles) {
  const cuda::MlaRowFormat fmt =
      cuda::mla_row_format(make_layout(kFormats[0], 512, 64, 64, 64), 1, 1.0f);
  EXPECT_EQ(cuda::plan_mla_attention(fmt, 1, 1, 16, 1, 768, 132, {.decode_rows = 8}).row_tiles, 2);
  EXPECT_EQ(cuda::plan_mla_attention(fmt, 1, 1, 16, 1, 768, 132).row_tiles, 1);
  // Auto (-1, the tunable's default): 8-row blocks where 16-row ones of one chunk each leave SMs
  // idle (1 x 12 < 132), 16-row ones where they do not (16 x 12 >= 132).
  EXPECT_EQ(cuda::plan_mla_attention(fmt, 1, 1, 16, 1, 768, 132, {.decode_rows = -1}).row_tiles, 2);
  EXPECT_EQ(cuda::plan_mla_attention(fmt, 16, 16, 16, 1, 768, 132, {.decode_rows = -1}).row_tiles,
            1);
  for (const Fmt& f : kFormats) {
    run_attention(f, {.heads = 16, .page = 16, .seqs = {{767, 1}}, .decode_rows = 8});
    run_attention(f, {.heads = 5, .page = 16, .seqs = {{300, 4}, {40, 1}}, .decode_rows = 8});
  }
}

// The decode kernel's three e4m3 conversions (integer ops, the conversion unit in the S warps,
// in both) over plain e4m3 and FlashMLA rows, 16 rows a block (8 rows: the default only), also
// with rows of very different sizes (FlashMLA: tile scales of one chunk's keys far apart, the P
// rescaling by the chunk's largest; plain e4m3: subnormal and saturated codes).
TEST(MlaAttention, DecodeConversions) {
  for (int i : {2, 7}) {
    for (int cvt : {cuda::kMlaCvtInt, cuda::kMlaCvtHwS, cuda::kMlaCvtHw}) {
      run_attention(kFormats[i],
                    {.heads = 16, .page = 16, .seqs = {{700, 1}, {64, 1}, {5, 1}}, .cvt = cvt});
      run_attention(
          kFormats[i],
          {.heads = 4, .page = 3, .seqs = {{300, 4}}, .splits = 2, .cvt = cvt, .spread = true});
    }
    run_attention(kFormats[i], {.heads = 8, .page = 64, .seqs = {{400, 1}}, .spread = true});
  }
}

// The decode kernel's V tile (kMlaCvtTile: each e4m3 value converted once, by the S warps, into a
// shared f16 tile the PV warps read; 2 stages, freed by the S warps): plain e4m3 (scaled, with a
// bf16 rope part) and FlashMLA rows; 16, 8 and 5 heads; the three stage layouts; contexts ending
// inside a group and a chunk; splits ending mid-chunk; several new tokens; rows of very different
// sizes (FlashMLA tile scales four orders of magnitude apart).
TEST(MlaAttention, DecodeVTile) {
  constexpr int kTile = cuda::kMlaCvtTile;
  for (int i : {1, 2, 4, 7}) {
    for (int groups : {2, 1, 0}) {
      run_attention(kFormats[i], {.heads = 16,
                                  .page = 16,
                                  .seqs = {{1001, 1}, {64, 1}, {5, 1}},
                                  .cvt = kTile,
                                  .row_groups = groups});
      run_attention(kFormats[i], {.heads = 8,
                                  .page = 64,
                                  .seqs = {{2047, 1}, {190, 2}},
                                  .splits = 3,
                                  .cvt = kTile,
                                  .row_groups = groups});
    }
    run_attention(kFormats[i], {.heads = 5,
                                .page = 3,
                                .seqs = {{300, 4}, {0, 1}},
                                .splits = 2,
                                .cvt = kTile,
                                .spread = true});
    run_attention(kFormats[i],
                  {.heads = 16, .page = 8, .seqs = {{4100, 1}}, .cvt = kTile, .spread = true});
  }
}

// The decode kernel's 16-row blocks with two groups of S warps (MlaPlanOptions::s_groups, 12 warps
// a block), by rows and by dims, against the CPU twin and against one group (by rows: bit for bit):
// bf16 (by dims: falls back to rows), plain e4m3 through the V tile and FlashMLA rows; 16 heads
// (Moonlight's batch 64 shape), 12 and 9 (the second group's rows partly or mostly past the tile's
// end), several new tokens a sequence (rows of two tokens in one tile), draft trees, the three
// stage layouts, splits with the kernel's own merge (its 384 threads) and with the merge kernel,
// rows of very different sizes, a graph replay. Formats and tile sizes the groups do not apply to
// keep one (the plan says so).
TEST(MlaAttention, DecodeSGroups) {
  for (int sg : {2, 3})
    for (int i : {0, 2, 4, 7}) {
      const Fmt& f = kFormats[i];
      for (int groups : {1, 2, 0})
        run_attention(f, {.heads = 16,
                          .page = 16,
                          .seqs = {{1001, 1}, {64, 1}, {5, 1}, {0, 1}},
                          .row_groups = groups,
                          .s_groups = sg});
      run_attention(f, {.heads = 16,
                        .page = 64,
                        .seqs = {{4095, 1}, {767, 1}},
                        .splits = 4,
                        .graph = true,
                        .fused_merge = cuda::kMlaFusedMergeMaxSplits,
                        .s_groups = sg});
      run_attention(f, {.heads = 16, .page = 16, .seqs = {{2000, 1}}, .splits = 3, .s_groups = sg});
      run_attention(f, {.heads = 12, .page = 3, .seqs = {{300, 1}, {40, 1}}, .s_groups = sg});
      run_attention(f, {.heads = 9,
                        .page = 16,
                        .seqs = {{300, 1}, {0, 1}},
                        .splits = 2,
                        .spread = true,
                        .s_groups = sg});
      run_attention(f, {.heads = 4, .page = 16, .seqs = {{500, 4}, {70, 3}}, .s_groups = sg});
      run_attention(
          f, {.heads = 2, .page = 8, .seqs = {{200, 8}, {33, 6}}, .trees = true, .s_groups = sg});
    }
  // Where they do not apply: 8-row blocks, several row tiles a sequence, e5m2 rows, e4m3 rows
  // without the V tile.
  const cuda::MlaRowFormat bf16 =
      cuda::mla_row_format(make_layout(kFormats[0], 512, 64, 64, 64), 1, 1.0f);
  const cuda::MlaRowFormat e5m2 =
      cuda::mla_row_format(make_layout(kFormats[3], 512, 64, 64, 64), 1, 1.0f);
  const cuda::MlaRowFormat e4m3 =
      cuda::mla_row_format(make_layout(kFormats[1], 512, 64, 64, 64), 1, 1.0f);
  EXPECT_EQ(cuda::plan_mla_attention(bf16, 64, 64, 16, 1, 4096, 132, {.s_groups = 2}).s_groups, 2);
  EXPECT_EQ(cuda::plan_mla_attention(bf16, 64, 64, 16, 1, 4096, 132, {.s_groups = 3}).s_groups, 2);
  EXPECT_EQ(cuda::plan_mla_attention(e4m3, 64, 64, 16, 1, 4096, 132, {.s_groups = 3}).s_groups, 3);
  EXPECT_EQ(cuda::plan_mla_attention(bf16, 64, 64, 16, 1, 4096, 132).s_groups, 2);  // default
  EXPECT_EQ(cuda::plan_mla_attention(bf16, 64, 64, 16, 1, 4096, 132, {.s_groups = 1}).s_groups, 1);
  EXPECT_EQ(cuda::plan_mla_attention(bf16, 64, 64, 8, 1, 4096, 132, {.s_groups = 2}).s_groups, 1);
  // More than one row tile a sequence (fp8_flashmla's 128 heads: the decode kernel) keeps one.
  const cuda::MlaRowFormat flash =
      cuda::mla_row_format(make_layout(kFormats[7], 512, 64, 64, 64), 1, 1.0f);
  EXPECT_EQ(cuda::plan_mla_attention(flash, 64, 64, 16, 1, 4096, 132).s_groups, 2);
  EXPECT_EQ(cuda::plan_mla_attention(flash, 64, 64, 128, 1, 4096, 132).s_groups, 1);
  EXPECT_EQ(cuda::plan_mla_attention(e5m2, 64, 64, 16, 1, 4096, 132, {.s_groups = 2}).s_groups, 1);
  EXPECT_EQ(cuda::plan_mla_attention(e4m3, 64, 64, 16, 1, 4096, 132,
                                     {.cvt = cuda::kMlaCvtHwS, .s_groups = 2})
                .s_groups,
            1);
}

// The decode kernel's L2 prefetch (every other test runs the default distance): none (the kernel
// before it), one chunk, and farther than most splits have chunks; page sizes whose runs start
// inside a chunk (3), end the chunk (64) and are single rows (1), splits ending mid-chunk. The
// prefetch changes no value: the same bound; a bad prefetch address would fault the launch.
TEST(MlaAttention, DecodeL2Prefetch) {
  for (int i : {0, 2, 7}) {
    for (int d : {0, 1, 6}) {
      run_attention(kFormats[i], {.heads = 16,
                                  .page = 3,
                                  .seqs = {{1000, 1}, {130, 1}, {0, 1}},
                                  .splits = 3,
                                  .l2_prefetch = d});
      run_attention(kFormats[i],
                    {.heads = 8, .page = 64, .seqs = {{2100, 1}, {640, 2}}, .l2_prefetch = d});
      run_attention(kFormats[i], {.heads = 16, .page = 1, .seqs = {{700, 1}}, .l2_prefetch = d});
    }
  }
}

// The decode kernel's three stage layouts (mla_decode_layout.cuh StageLayout): rows copied in
// groups of 8 consecutive slots (row_groups 2, tile t taking keys 8 (m % 8) + 4 (m / 8) + t) or of
// 4 (row_groups 1, keys 4m + t; every other test with a page size that is a multiple of 4), and
// one row a copy (keys 16 t + m; page sizes 1 and 3 elsewhere; here forced). Page sizes 4, 12 (3
// groups of 4 a page; groups of 8 fall back to 4), 8, 16, 24 (3 groups of 8 a page), 64; contexts
// ending inside a group, inside a chunk, on a page bound; splits that end mid-chunk; 5, 8 and 16
// heads; 2 and 3 stages (the stage ring wrapping at other chunks).
TEST(MlaAttention, DecodeRowGroups) {
  for (int i : {0, 1, 4, 7}) {
    for (int groups : {2, 1, 0}) {
      run_attention(kFormats[i], {.heads = 16,
                                  .page = 4,
                                  .seqs = {{1001, 1}, {130, 1}, {2, 1}, {63, 1}},
                                  .row_groups = groups});
      run_attention(
          kFormats[i],
          {.heads = 5, .page = 12, .seqs = {{777, 3}, {0, 2}}, .splits = 4, .row_groups = groups});
      run_attention(kFormats[i],
                    {.heads = 16, .page = 16, .seqs = {{4095, 1}, {66, 1}}, .row_groups = groups});
      run_attention(kFormats[i], {.heads = 8,
                                  .page = 64,
                                  .seqs = {{2047, 1}, {64, 1}, {190, 2}},
                                  .splits = 3,
                                  .row_groups = groups});
      run_attention(kFormats[i], {.heads = 16,
                                  .page = 8,
                                  .seqs = {{1003, 1}, {7, 1}, {72, 1}},
                                  .row_groups = groups,
                                  .stages = 2});
      run_attention(kFormats[i], {.heads = 5,
                                  .page = 24,
                                  .seqs = {{599, 2}, {23, 1}},
                                  .splits = 3,
                                  .row_groups = groups,
                                  .stages = 3});
    }
  }
}

}  // namespace
}  // namespace strata::testing
