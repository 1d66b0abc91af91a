// A request's penalties and logit_bias as LogitEdits (backend.h) on its row of logits, computed
// on the host from the counts of the tokens it has generated; a backend applies them where the
// logits are (Backend::edit_logits: in place on the CPU reference, a kernel on CUDA) before it
// samples. SGLang's rules: the penalties count the output only (not the prompt); presence and
// frequency are subtracted, then the repetition penalty divides a positive logit and multiplies a
// negative one, then logit_bias is added.
//
// Engine thread only. Cost per step: one edit (20 bytes) per distinct generated token of each
// penalized row, plus one per logit_bias entry.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "engine/sampling_params.h"

namespace strata {

// How often each token occurs in a request's output.
class OutputTokenCounts {
 public:
  void add(int32_t token) { ++counts_[token]; }
  void add(std::span<const int32_t> tokens) {
    for (int32_t t : tokens) add(t);
  }
  int32_t count(int32_t token) const {
    auto it = counts_.find(token);
    return it == counts_.end() ? 0 : it->second;
  }
  const std::unordered_map<int32_t, int32_t>& counts() const { return counts_; }

 private:
  std::unordered_map<int32_t, int32_t> counts_;
};

// Appends the edits of logit row `row` for a request with `params` and output `counts`: one per
// generated token when a penalty is set, one per logit_bias entry (merged when a token is both),
// and -inf on each token of `banned` (merged with the others: edits of one row never name a token
// twice, as the CUDA kernel applies them in parallel). Nothing when params.edits_logits() is false
// and `banned` is empty.
void append_logit_edits(const SamplingParams& params, const OutputTokenCounts& counts, int32_t row,
                        std::span<const int32_t> banned, std::vector<LogitEdit>* out);

// The tokens a request may not sample at output position `position` (0: its first output token):
// before params.min_new_tokens, its stop tokens and, unless ignore_eos, `eos_ids`; else none.
void min_tokens_banned(const SamplingParams& params, int32_t position,
                       std::span<const int32_t> eos_ids, std::vector<int32_t>* out);

}  // namespace strata
