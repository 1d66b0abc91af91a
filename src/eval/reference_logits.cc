#include "eval/reference_logits.h"

#include <algorithm>

#include "core/check.h"

namespace strata {

ReferenceLogits::ReferenceLogits(Backend& backend, int windows, int context_len, int64_t vocab)
    : backend_(backend), windows_(windows), context_len_(context_len), vocab_(vocab) {}

void ReferenceLogits::store(const Tensor& logits, int64_t row, int w, int pos, int n) {
  CHECK(w >= 0 && w < windows_ && pos >= 0 && pos + n <= context_len_ && logits.dim(-1) == vocab_);
  if (!rows_) rows_ = backend_.alloc(logits.dtype, {int64_t(windows_) * context_len_, vocab_});
  const int64_t at = int64_t(w) * context_len_ + pos;
  backend_.copy_columns(logits.slice_rows(row, row + n), 0, vocab_,
                        rows_->view().slice_rows(at, at + n), 0);
}

std::vector<LogitStatsRow> ReferenceLogits::score(const Tensor& cand, int64_t row, int w, int pos,
                                                  int n, const std::vector<int32_t>& window) {
  CHECK_MSG(rows_ != nullptr, "ReferenceLogits::score before any store");
  CHECK(int(window.size()) == context_len_);
  const int scored = std::min(pos + n, context_len_ - 1) - pos;
  if (scored <= 0) return {};
  std::vector<int32_t> targets(window.begin() + pos + 1, window.begin() + pos + 1 + scored);
  const int64_t at = int64_t(w) * context_len_ + pos;
  std::vector<LogitStatsRow> out(size_t(scored), LogitStatsRow{});
  backend_.logit_stats(rows_->view().slice_rows(at, at + scored),
                       cand.slice_rows(row, row + scored), targets.data(), out.data());
  return out;
}

}  // namespace strata
