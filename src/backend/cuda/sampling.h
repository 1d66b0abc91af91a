// Sampling on the GPU (sampling.cu): one block per row; only the ids are copied back.
#pragma once

#include "backend/cuda/launch.h"

namespace strata::cuda {

// backend.h's SampleRowParams, byte for byte (the host array is staged as is).
struct SampleRowDev {
  float temperature;
  float top_p;
  int32_t top_k;
  float min_p;
  double uniform;
};
struct SampleParams {
  const void* logits;          // [rows, vocab] bf16 (or f32: greedy rows only)
  const SampleRowDev* params;  // device [rows]
  int32_t* out;                // device [rows]
  uint32_t* hist;              // device [rows, 65536] scratch when any row samples, else null
  int64_t vocab;
  int rows;
  int f32;
  int vec;  // rows are 16-byte aligned and a whole number of 16-byte vectors
  int any_sampling;
};
void launch_sample(const SampleParams& p, const Launch& launch);

// backend.h's LogitEdit, byte for byte (the host array is staged as is).
struct LogitEditDev {
  int32_t row;
  int32_t token;
  float subtract;
  float scale;
  float bias;
};
struct EditLogitsParams {
  void* logits;               // [rows, vocab] bf16 or f32, edited in place
  const LogitEditDev* edits;  // device [num_edits]
  int64_t vocab;
  int64_t num_edits;
  int f32;
};
// One thread per edit (a row names a token at most once, so no two threads write one logit).
void launch_edit_logits(const EditLogitsParams& p, const Launch& launch);

}  // namespace strata::cuda
