// Decode context parallelism (DCP) for MLA (issue 27, vLLM's --decode-context-parallel-size):
// the N ranks of a DCP group each hold 1/N of every sequence's latent KV instead of all of it,
// so the group's KV capacity is N times the replicated one, with no loss.
//
// Layout (vLLM's; the scheduler is untouched): the engine's page holds page_size · N tokens
// (page_size = the pool's page on each rank) and the same page ids live on every rank. Token t of
// a sequence lives on rank t mod N, at local index t div N of the same page table: local token j
// is in page j div page_size at offset j mod page_size, an ordinary paged layout. So page ids,
// the radix prefix cache, the host tier (each rank copies its shard of the same pages),
// retraction, chunked prefill and /flush_cache are unchanged; only the KV write (a rank writes
// the tokens it owns), the attention metadata (each rank's local context) and the attention
// change.
//
// Attention (every step, prefill and decode alike): each rank's absorbed query of its heads
// (kv_lora_rank + rope dims a head, arch/mla.h) is all-gathered over the group; each rank attends
// every group head over its shard (causal by absolute position) and keeps the partial output in
// latent space with its log-sum-exp; an all-to-all hands each rank the N partials of its own
// heads, which it merges exactly (LSE-weighted) before W_UV. Ranks with fewer heads than the
// group's most (the uneven split of tests) pad their query; the padded heads are never read.
//
// Communication per layer per new token: all-gather (N - 1) · H_g · (R + r) activation values
// in and all-to-all (N - 1) / N · H_g · (R + 1) float32 values out per rank, H_g the group's
// padded heads, R kv_lora_rank, r the rope dim (planner/planner.h prints it).
#pragma once

#include <cstdint>
#include <vector>

#include "arch/mla.h"
#include "backend/comm.h"
#include "backend/dcp_attention.h"

namespace strata {

// One rank's view of a step under DCP: its local context per sequence and the new tokens it
// owns. Built once per forward from the engine's metadata, O(tokens + sequences).
struct DcpLocalBatch {
  std::vector<int32_t> kv_lens;      // [num_seqs] local tokens after this step
  std::vector<int32_t> owned_rows;   // rows of the batch's new tokens this rank stores
  std::vector<int32_t> owned_slots;  // [owned] their slots in this rank's pool
  AttentionMetadata attn;            // the step's, with local kv_lens and the pool's page size
  AttentionMetadata write;           // the owned tokens only (num_tokens, slot_mapping)

  // `meta`: the engine's metadata (page_size = pool_page_size · shard.size). The result points
  // into `meta` and into itself: keep both alive, and do not copy it.
  void build(const AttentionMetadata& meta, DcpShard shard, int pool_page_size);
};

// The absorbed MLA of arch/mla.h over a DCP group: writes this rank's owned cache rows
// (kv_rows [T, cache_dim], all new tokens) and attends. q [T, heads, nope + rope] with rope
// applied; out [T, heads, v_head_dim]. `group_heads`: the most heads any rank of the group has.
void mla_dcp_attention(Backend& be, DcpAttention& ops, Communicator& group, const MlaDims& d,
                       int group_heads, const MlaAbsorbedWeights& w, float scale, const Tensor& q,
                       const Tensor& kv_rows, KvStorage& kv, int layer, const DcpLocalBatch& local,
                       const Tensor& out);

}  // namespace strata
