// Row and column copies (copies.cu): embedding, gather_rows, slice_columns and copy_columns.
#pragma once

#include "backend/cuda/launch.h"

namespace strata::cuda {

// out[i, out_begin + c] = x[rows ? rows[i] : i, x_begin + c] for c < width: embedding, gather,
// slice_columns and copy_columns are all this copy (elements of `elem_bytes`).
struct CopyRowsParams {
  const void* x;
  void* out;
  const int32_t* rows;  // device [n] or null (identity)
  int64_t n;            // output rows
  int64_t x_stride;     // elements per x row
  int64_t out_stride;   // elements per out row
  int64_t x_begin;
  int64_t out_begin;
  int64_t width;
  int elem_bytes;
};
void launch_copy_rows(const CopyRowsParams& p, const Launch& launch);

// Up to four column slices of the same rows in one launch (graph mode merges the Q/K/V slices of
// a fused projection): segment s copies x[:, x_begin_s : x_begin_s + width_s] to out_s.
constexpr int kMaxSlices = 4;
struct MultiSliceParams {
  const void* x;
  int64_t n;         // rows
  int64_t x_stride;  // elements per x row
  int elem_bytes;
  int count;
  void* out[kMaxSlices];
  int64_t x_begin[kMaxSlices];
  int64_t width[kMaxSlices];  // = out row stride
};
void launch_multi_slice(const MultiSliceParams& p, const Launch& launch);

}  // namespace strata::cuda
