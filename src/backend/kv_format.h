// The byte layout of one token's K row in a KV layer (KvLayout::k_row_bytes), written once so the
// CPU reference and any device backend agree on what a stored row means. Plain rows are k_dim
// values of the layer's dtype divided by the layer's scale; split MLA rows (rope part in its own
// dtype) and FlashMLA FP8 rows are described in backend.h (KvFormat).
//
// Cost: one pass over the row. Thread-safe (pure functions of their arguments).
#pragma once

#include "backend/backend.h"

namespace strata {

// Stores k_dim float32 values `src` of `layer` into `dst` (k_row_bytes(layer) bytes). `scale` is
// the layer's K scale (stored = value / scale); FlashMLA rows ignore it (per-tile scales).
void encode_k_row(const KvLayout& layout, int layer, const float* src, float scale, void* dst);
// The inverse: reads k_dim float32 values of a stored row.
void decode_k_row(const KvLayout& layout, int layer, const void* src, float scale, float* dst);

// Plain rows: n values of `dtype`. stored = value / scale; read back × scale.
void encode_plain_row(DType dtype, const float* src, int64_t n, float scale, void* dst);
void decode_plain_row(DType dtype, const void* src, int64_t n, float scale, float* dst);

}  // namespace strata
