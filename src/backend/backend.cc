#include "backend/backend.h"

namespace strata {

int64_t KvLayout::bytes_per_token() const {
  int64_t total = 0;
  for (int l = 0; l < num_layers; ++l) total += dtype_bytes_for(layer_dtype(l), k_dim + v_dim);
  return total;
}

}  // namespace strata
