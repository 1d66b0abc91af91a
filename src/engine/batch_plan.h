// BatchPlan: the host-side metadata of one forward step, built from the sequences the scheduler
// picked: the flattened new tokens and, per sequence, its slice of them, its context length, its
// CSR page table and where each new token's K/V goes. view() is the AttentionMetadata contract the
// backends read (backend/attention_metadata.h).
//
// Built on the engine thread once per step; O(new tokens + pages). Immutable afterwards.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/attention_metadata.h"
#include "core/status.h"
#include "engine/request.h"

namespace strata {

// One sequence of a step: its next num_new_tokens tokens (from request->kv_len()) are computed,
// then its draft tokens (speculative decoding, engine/spec/drafter.h) at the positions after them.
struct ScheduledSeq {
  Request* request = nullptr;
  int32_t num_new_tokens = 0;
  bool sample =
      false;  // its last new token's logits are sampled (false: a non-final prefill chunk)
  // Drafts to verify (a decode only): computed after the request's last token, and each gets a
  // logits row too, so a sampled seq has 1 + draft.size() rows (engine/spec/verify.h).
  std::vector<int32_t> draft{};
  // Empty: the drafts are a chain. Else a draft tree (engine/spec/draft_tree.h; a decode of one
  // new token only): draft[i] is tree node i + 1 and draft_parents[i] (< i + 1) its parent, node 0
  // the request's last token. Node i's KV row is kv_len() + i, its rope position kv_len() +
  // depth, and it attends to the committed tokens and its ancestors (BatchPlan::tree_mask).
  std::vector<int32_t> draft_parents{};
  // Rows after the drafts that the verify computes and ignores (engine/spec/verify_shape.h): they
  // give every verifying seq of a step the same number of rows, so the forward's shape (and its
  // CUDA graph) depends on the batch size only. Each takes a logits row (sampled greedily, never
  // read) and a KV slot of the request's own pages past its drafts (garbage past kv_len, as a
  // rejected draft's). A chain's pads continue it (causal rows after the last draft); a tree's
  // are nodes that attend to the committed tokens and themselves only (as roots: their tree word
  // is their own bit, their rope position kv_len).
  int32_t pad_rows = 0;
  // New tokens and drafts: the tokens the step computes for the request (pads excluded).
  int32_t num_tokens() const { return num_new_tokens + int32_t(draft.size()); }
  // Rows of the request in the step's forward: num_tokens() and the pads.
  int32_t num_rows() const { return num_tokens() + pad_rows; }
};

// The positions [first, last) of a step's chunk whose logits rows score the prompt's next token
// (Request::prompt_score_from), for a seq of num_new_tokens new tokens from the request's
// kv_len(): empty unless the request owes prompt logprobs. They precede the chunk's sampled row
// (if any) as consecutive rows: the seq's first `size()` logits rows of the step.
struct PromptScoreRows {
  int32_t first = 0, last = 0;
  int32_t size() const { return last - first; }
};
PromptScoreRows prompt_score_rows(const Request& r, int32_t num_new_tokens);

class BatchPlan {
 public:
  // Each request's page table must cover kv_len() + num_rows() tokens.
  static BatchPlan build(std::span<const ScheduledSeq> seqs, int32_t page_size);

  int num_seqs() const { return static_cast<int>(kv_lens.size()); }
  int num_tokens() const { return static_cast<int>(token_ids.size()); }
  // The contract with the backends; valid while this plan lives and is not modified.
  AttentionMetadata view() const;

  // The wire form rank 0 broadcasts to the other tensor-parallel ranks each step
  // (dist/tp_driver.h): every field below, little-endian, behind a magic and a version.
  // O(plan size). deserialize() checks every length and CSR invariant the backends rely on, so a
  // corrupt message is a DataLoss error, never an out-of-bounds read.
  std::vector<uint8_t> serialize() const;
  static StatusOr<BatchPlan> deserialize(std::span<const uint8_t> bytes);

  int32_t page_size = 1;
  std::vector<int32_t> token_ids;     // [num_tokens] flattened new tokens, sequence by sequence
  std::vector<int32_t> positions;     // [num_tokens] position of each new token in its sequence
  std::vector<int32_t> q_indptr;      // [num_seqs + 1] rows of each sequence's new tokens
  std::vector<int32_t> kv_lens;       // [num_seqs] context after this step (cached + new)
  std::vector<int32_t> page_indptr;   // [num_seqs + 1] into page_indices
  std::vector<int32_t> page_indices;  // [page_indptr[num_seqs]] pages covering kv_lens[s] tokens
  std::vector<int32_t> slot_mapping;  // [num_tokens] page * page_size + offset of each new token
  // [num_rows] the rows whose logits are sampled: of each seq, its prompt-scoring rows
  // (prompt_score_rows), then, if sampled, its last new token's, its drafts' and its pad rows'
  // (consecutive rows, in order)
  std::vector<int32_t> logits_rows;
  std::vector<int32_t> sampled_seqs;  // [num_rows] which sequence each logits row belongs to
  // Empty when no sequence has a draft tree; else [num_tokens] (AttentionMetadata::tree_mask):
  // each tree node's ancestor word, 0 for every other token.
  std::vector<uint64_t> tree_mask;
};

}  // namespace strata
