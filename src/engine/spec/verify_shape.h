// Fixed-shape verify (issue 26): every verifying request of a decode step contributes the same
// number of rows to the target's forward, however many drafts it has (fewer near its token limit,
// none where the drafter missed its last commit), as SGLang's EAGLE worker verifies
// num_draft_tokens rows per request. The forward's shape then depends on the batch size only, so
// a CUDA graph captured for a batch size serves every later step of that size (graph_recorder.h
// keys graphs by the launches' parameters, row counts included), and the drafter's observe()
// after it (which runs every verify row) has one shape per batch size too.
//
// The extra rows are ScheduledSeq::pad_rows (batch_plan.h): tokens, KV slots in the request's own
// pages past its drafts, logits rows sampled greedily and never read. Nothing a later step reads
// depends on them: their KV lies past the committed tokens like a rejected draft's (rewritten
// before it is read, or released with its page), and no real row attends to them (a chain's pads
// come after every draft; a tree's attend to the committed tokens and themselves only and are no
// one's ancestor). A request whose pages do not hold the full block (the pool was short when the
// drafts' room was reserved) keeps its own row count: that step's shape is new, nothing else.
#pragma once

#include <cstdint>
#include <span>

#include "engine/batch_plan.h"

namespace strata {

// Pads each decoding seq of `seqs` (a decode step: one new token each, sampled) to `rows` rows
// (1 + num_draft_tokens - 1 of the speculative config) where its pages hold kv_len() + rows
// tokens. Returns how many decoding seqs stay short of `rows` (their pages do not hold them).
int32_t pad_verify_rows(std::span<ScheduledSeq> seqs, int32_t rows, int32_t page_size);

}  // namespace strata
