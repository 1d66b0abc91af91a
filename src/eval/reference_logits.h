// The reference pass's logits of a group of windows, kept where the model computed them (the
// device on CUDA) between the reference pass and each candidate's, and the scoring of a
// candidate's logits against them there (Backend::logit_stats): per position only a
// LogitStatsRow comes back to the host, never a full-vocabulary row. Stored in the logits' own
// dtype (bf16 on CUDA: exactly what the model produced), window by window: row w·L + position.
#pragma once

#include <cstdint>
#include <vector>

#include "arch/model.h"

namespace strata {

class ReferenceLogits {
 public:
  // Room for `windows` windows of `context_len` positions over `vocab` tokens; memory is taken
  // at the first store (in that logits' dtype).
  ReferenceLogits(Backend& backend, int windows, int context_len, int64_t vocab);

  // Stores rows [row, row + n) of `logits` [rows, vocab] as window w's positions [pos, pos + n).
  void store(const Tensor& logits, int64_t row, int w, int pos, int n);
  // Scores rows [row, row + n) of `cand` as window w's positions [pos, pos + n) against the
  // stored rows, each predicting the next token of `window` (its tokens); the window's last
  // position has no next token and is left out. Returns one row per scored position, in order.
  std::vector<LogitStatsRow> score(const Tensor& cand, int64_t row, int w, int pos, int n,
                                   const std::vector<int32_t>& window);

 private:
  Backend& backend_;
  int windows_, context_len_;
  int64_t vocab_;
  DeviceTensorPtr rows_;  // [windows · context_len, vocab]
};

}  // namespace strata
