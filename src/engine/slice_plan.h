// BatchPlans of sequences that no Request holds: eval's teacher forcing (eval/paged_runner.h)
// picks its batches itself, with no scheduler, and plans them with the same code as the engine's
// steps (BatchPlan::build), so the page tables, slots and logits rows are the engine's.
#pragma once

#include <cstdint>
#include <span>

#include "engine/batch_plan.h"

namespace strata {

// Which of a slice's new tokens get a logits row.
enum class SliceLogits {
  kNone,  // none (ScheduledSeq::sample false: a non-final prefill chunk)
  kLast,  // the last one (the token a sampler would pick next)
  kAll,   // every one (teacher forcing scores every position)
};

// One sequence of a step: `tokens` are computed at positions start, start + 1, ...; `pages`
// cover the first start + tokens.size() tokens.
struct SeqSlice {
  std::span<const int32_t> tokens;
  int32_t start = 0;
  std::span<const int32_t> pages;
  SliceLogits logits = SliceLogits::kLast;
};

// The plan of one step over `seqs` (each non-empty); the logits rows of sequence s are tagged s in
// sampled_seqs.
BatchPlan build_slice_plan(std::span<const SeqSlice> seqs, int32_t page_size);

}  // namespace strata
