// top_k on the GPU (topk.cu; backend/top_k.h TopKOp, the reference backend/cpu/topk.cc): one
// block per row; only each row's k ids and log-probabilities come back.
#pragma once

#include "backend/cuda/launch.h"

namespace strata::cuda {

struct TopKParams {
  const void* logits;  // [rows, vocab] bf16 or f32, rows `vocab` apart
  int32_t* out;        // device [rows, 2k]: the k ids, then the k log-probabilities' float bits
  int64_t vocab;
  int rows;
  int k;
  int f32;
  int logprobs;  // 0: the second half is left alone
};
void launch_top_k(const TopKParams& p, const Launch& launch);

}  // namespace strata::cuda
