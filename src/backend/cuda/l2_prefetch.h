// Weights brought into L2 ahead of their reads (Backend::prefetch; CudaTunables::
// l2_prefetch_bytes): the hints of a layer are carried by the next launch with spare time and
// CTAs across the GPU, the fused MLA query (mla_query.cu) or, where it declines (no q_lora, an FP8
// q_b), W_UK's per-head GEMV on its side branch (per_head_gemv.cu), whose CTAs each issue their
// share as bulk prefetches of the TMA engine after their wait (nothing waits for them).
//
// Why: at batch 1 an MLA layer's attention (the query, the decode, the split merge) waits on
// latency, not bandwidth (a Kimi-K2.5 rank's decode read its 4.7 MB of keys in ~8 µs, ~0.6 TB/s:
// bench/results/2026-12-04-session24.md), while the weights right after it stream from DRAM:
// o_proj 14.7 MB, the router 5.5 MB, the shared experts 11 MB. Read from L2 they cost less of the
// DRAM time the routed experts then need.
#pragma once

#include <cstdint>

namespace strata::cuda {

constexpr int kL2PrefetchMaxRanges = 6;

// Byte ranges (16-byte aligned, lengths multiples of 16) to bring into L2.
struct L2PrefetchRanges {
  const char* ptr[kL2PrefetchMaxRanges];
  int64_t bytes[kL2PrefetchMaxRanges];
  int count;
  int reserved_zero;  // keeps the struct free of padding (its bytes are a graph's signature)
};
static_assert(sizeof(L2PrefetchRanges) == 2 * 8 * kL2PrefetchMaxRanges + 8,
              "L2PrefetchRanges has no padding");

}  // namespace strata::cuda
