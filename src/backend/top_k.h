// TopKOp: a row's k largest logits and their log-probabilities, computed where the logits are, so
// that only 2k numbers a row leave the device (a drafter's candidates: engine/spec/
// eagle3_drafter.h, which otherwise downloads whole rows and sorts them on the host). A backend
// with the op implements TopKOp beside Backend (the CPU reference: backend/cpu/topk.cc; CUDA:
// backend/cuda/topk.cu); top_k_op() finds it.
#pragma once

#include <cstdint>

#include "backend/backend.h"

namespace strata {

// The most entries a row (TopKOp::top_k's k).
inline constexpr int kMaxTopK = 64;

// The reference on one float32 row (backend/cpu/topk.cc): the k largest entries, largest first,
// ties to the lower index (so ids[0] is argmax_row_reference's), into ids[k], and their
// log-probabilities under the row's softmax (max + log Σ e^(x - max), the sum in double, rounded
// to float; then x - that) into logprobs[k] (null: not computed). NaNs come after every number.
// 1 <= k <= min(vocab, kMaxTopK).
void top_k_row_reference(const float* logits, int64_t vocab, int k, int32_t* ids, float* logprobs);

class TopKOp {
 public:
  virtual ~TopKOp() = default;
  // Per row r of `logits` [rows, vocab] (a tensor of this backend, float dtype; the rows may be a
  // view into a larger tensor): top_k_row_reference's ids into host ids[r * k ..] and, unless
  // `logprobs` is null, its log-probabilities into host logprobs[r * k ..] (a device may differ
  // from the reference by float rounding in them, never in the ids; a row with fewer than k
  // numbers leaves the rest of its ids unspecified). Ends the backend's step (a CUDA graph step
  // too, like a download).
  virtual void top_k(const Tensor& logits, int k, int32_t* ids, float* logprobs) = 0;
};

// The backend's top-k op, or null when it has none.
inline TopKOp* top_k_op(Backend& backend) { return dynamic_cast<TopKOp*>(&backend); }

}  // namespace strata
