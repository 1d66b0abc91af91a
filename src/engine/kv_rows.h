// KV rows of one request, as bytes: what a batch job's checkpoint stores so that a resumed
// generation continues by decoding (GenerateRequest::resume_kv) instead of prefilling its prompt
// and partial output again (pipeline/kv_checkpoint.h writes them to disk).
//
// Rows are whole pages, exactly as the KV pool stores them (every layer, K then V, the storage
// dtype's bytes unchanged), page-major so that blocks concatenate:
//   for each page: for each layer: K [page_size, k_row_bytes] then V [page_size, v_row_bytes]
// Row i is the KV of token i of prompt + output.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace strata {

struct KvRows {
  int64_t first_row = 0;           // a multiple of the page size
  int64_t rows = 0;                // a multiple of the page size
  std::vector<std::byte> bytes{};  // rows / page_size pages of KvRowsLayout::page_bytes
};

// What KV rows are only valid with: compared as a whole (`header`) before rows are loaded into
// a pool, so rows of another model, dtype, layout, page size or rank are never used.
struct KvRowsLayout {
  std::string header;  // JSON: model fingerprint, KV dtype(s), row bytes, page size, tp rank
  int32_t page_size = 0;
  int64_t page_bytes = 0;  // one page, every layer, K and V
  int64_t bytes_per_token() const { return page_size > 0 ? page_bytes / page_size : 0; }
};

}  // namespace strata
