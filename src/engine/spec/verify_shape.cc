#include "engine/spec/verify_shape.h"

#include "core/check.h"

namespace strata {

int32_t pad_verify_rows(std::span<ScheduledSeq> seqs, int32_t rows, int32_t page_size) {
  CHECK_GE(rows, 1);
  int32_t short_seqs = 0;
  for (ScheduledSeq& seq : seqs) {
    const Request& r = *seq.request;
    if (r.state() != RequestState::kDecoding || !seq.sample || seq.num_new_tokens != 1) continue;
    seq.pad_rows = 0;
    const int32_t have = seq.num_rows();
    CHECK_MSG(have <= rows, "request {}: {} rows to verify, more than the {} of a verify", r.id(),
              have, rows);
    if (int64_t(r.pages().size()) * page_size < int64_t(r.kv_len()) + rows) {
      ++short_seqs;
      continue;
    }
    seq.pad_rows = rows - have;
  }
  return short_seqs;
}

}  // namespace strata
