// eval-kv's per-position statistics on the GPU (logit_stats.cu; backend.h LogitStatsRow, the
// reference backend/cpu/logit_stats.cc): one block per row, only five floats a row come back.
#pragma once

#include "backend/cuda/launch.h"

namespace strata::cuda {

struct LogitStatsParams {
  const void* ref;         // [rows, vocab] bf16 or f32
  const void* cand;        // [rows, vocab], the same dtype
  const int32_t* targets;  // device [rows]
  float* out;              // device [rows, 5]: LogitStatsRow's fields in order
  int64_t vocab;
  int rows;
  int f32;
};
void launch_logit_stats(const LogitStatsParams& p, const Launch& launch);

}  // namespace strata::cuda
