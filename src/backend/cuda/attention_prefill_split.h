// Split-KV prefill attention (attention_prefill_split.cu): short query chunks over long cached
// contexts (a radix prefix hit with a short new suffix, a host-tier hit, chunked prefill's last
// small chunk). The regular prefill kernels give one block per (query tile, KV head) and stream
// the tile's whole context serially, so 16 new tokens over 32K cached ones run on a handful of
// SMs; here each tile's keys are split across blocks and a second kernel merges the partials.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/attention_metadata.h"
#include "backend/cuda/attention.h"

namespace strata::cuda {

// Query rows of one block: (token, query head of the group) pairs, token-major, so a tile spans
// kSplitPrefillRows / group tokens of one KV head.
constexpr int kSplitPrefillRows = 64;

struct SplitPrefillParams {
  // a.tiles: the work list, device [a.num_tiles, 4] = (sequence, first query token of the tile,
  // split index, first partial group or -1 when the tile has one split and writes `out` itself);
  // a.split_len: keys per split (a multiple of 64); a.partial_o [groups, kv_heads, 64, head_dim]
  // and a.partial_ml [groups, kv_heads, 64, 2] (log2-domain max, sum): unnormalized partials.
  AttentionParams a;
  const int32_t*
      combine;  // device [num_combine, 4] = (sequence, first query token, splits, first group)
  int num_combine;
  int pad_;
};

bool split_prefill_supported(int head_dim, int group);

struct SplitPrefillPlan {
  std::vector<int32_t> work;     // [n, 4], as SplitPrefillParams::a.tiles
  std::vector<int32_t> combine;  // [n, 4], as SplitPrefillParams::combine
  int split_len = 0;
  int64_t partial_groups = 0;  // each kv_heads × 64 rows of (head_dim + 2) floats
  std::vector<char> seqs;      // [num_seqs]: 1 = the split kernel writes this sequence's rows
  // Whether the split kernel serves sequence s (the regular kernels take the others).
  bool takes(int s) const { return !seqs.empty() && seqs[size_t(s)] != 0; }
};
// Plans one prefill batch (host metadata): which sequences take the split path and its work.
// `mode` (CudaTunables::prefill_split_mode): 0 none, 1 auto (short chunks over long contexts,
// when the regular kernels' grid would wait on their long tiles), 2 all whenever supported;
// splits sized for `blocks_per_sm` blocks per SM over the batch. false: none takes it, every
// sequence takes the regular kernels.
bool plan_split_prefill(const AttentionMetadata& meta, int head_dim, int group, int kv_heads,
                        bool fp8_kv, int num_sms, int mode, int blocks_per_sm,
                        SplitPrefillPlan* plan);
void init_split_prefill_kernels();
void launch_split_prefill(const SplitPrefillParams& p, const Launch& launch);

}  // namespace strata::cuda
