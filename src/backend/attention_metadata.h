// The per-step attention metadata every layer reads: a flattened ragged batch of new tokens and,
// per sequence, its pages in the KV pool as a CSR page table. Built once per step on the host by
// engine/BatchPlan; backends that run on a device upload it once per step.
#pragma once

#include <cstdint>

namespace strata {

// All pointers are host pointers owned by the BatchPlan, valid for one forward call.
struct AttentionMetadata {
  int num_seqs = 0;
  int num_tokens = 0;                    // T: total new tokens in the batch
  int page_size = 1;                     // tokens per KV page
  const int32_t* q_indptr = nullptr;     // [num_seqs + 1] rows of each sequence's new tokens
  const int32_t* kv_lens = nullptr;      // [num_seqs] context length after this step (cached + new)
  const int32_t* page_indptr = nullptr;  // [num_seqs + 1] into page_indices
  const int32_t* page_indices = nullptr;  // [page_indptr[num_seqs]] page ids, in sequence order
  const int32_t* positions = nullptr;     // [num_tokens] position of each new token
  const int32_t* slot_mapping = nullptr;  // [num_tokens] page * page_size + offset to write K/V
  // The new tokens of sequence s are the last (q_indptr[s+1]-q_indptr[s]) of its kv_lens[s]
  // KV rows and attend causally to everything before them, unless tree_mask says otherwise.

  // Draft trees (speculative decoding, engine/spec/draft_tree.h): null (all causal), or
  // [num_tokens] one word per new token. A non-zero word makes its token attend to the
  // sequence's cached rows plus those of the sequence's new tokens j (0-based among them) whose
  // bit j is set (its tree ancestors and itself) instead of every earlier new token; such a
  // sequence has at most 64 new tokens, and positions[] (rope) need not follow the row order.
  // A zero word keeps the causal rule.
  const uint64_t* tree_mask = nullptr;
};

}  // namespace strata
