// Backend::kv_move_rows on the GPU: KV rows copied within the pool, every layer, K and V as stored
// (any dtype or row format), in one launch. Speculative decoding with draft trees moves the
// accepted nodes' rows into place with it (engine/spec/tree_verify.h). Block (layer, K|V); each
// thread owns 4-byte columns of the rows and applies the moves in order, so a move may read a row
// an earlier move wrote, as the op's contract says.
#include <vector>

#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_backend.h"

namespace strata::cuda {
namespace {

struct KvMoveLayer {
  char* k;              // the layer's K rows [slots, k_row_bytes]
  char* v;              // its V rows [slots, v_row_bytes], or null (MLA)
  int64_t k_row_bytes;  // multiples of 4
  int64_t v_row_bytes;
};
static_assert(sizeof(KvMoveLayer) == 32, "KvMoveLayer is staged as int32 words");

struct KvMoveParams {
  const KvMoveLayer* layers;  // device [layers]
  const int32_t* from;        // device [n]
  const int32_t* to;          // device [n]
  int n;
  int num_layers;
};

__global__ void kv_move_kernel(KvMoveParams p) {
  pdl_wait();
  pdl_trigger();
  const KvMoveLayer layer = p.layers[blockIdx.x];
  char* base = blockIdx.y == 0 ? layer.k : layer.v;
  const int64_t row_bytes = blockIdx.y == 0 ? layer.k_row_bytes : layer.v_row_bytes;
  if (base == nullptr) return;
  for (int64_t c = int64_t(threadIdx.x) * 4; c < row_bytes; c += int64_t(blockDim.x) * 4)
    for (int i = 0; i < p.n; ++i)
      *reinterpret_cast<uint32_t*>(base + int64_t(p.to[i]) * row_bytes + c) =
          *reinterpret_cast<const uint32_t*>(base + int64_t(p.from[i]) * row_bytes + c);
}

void launch_kv_move(const KvMoveParams& p, const Launch& launch) {
  if (p.n == 0 || p.num_layers == 0) return;
  launch_pdl(kv_move_kernel, dim3(unsigned(p.num_layers), 2), 128, 0, launch, p);
}

}  // namespace

void CudaBackend::kv_move_rows(KvStorage& kv, const int32_t* from_slots, const int32_t* to_slots,
                               int n) {
  const KvLayout& lay = kv.layout();
  const int64_t slots = int64_t(lay.num_pages) * lay.page_size;
  for (int i = 0; i < n; ++i)
    CHECK_MSG(
        from_slots[i] >= 0 && from_slots[i] < slots && to_slots[i] >= 0 && to_slots[i] < slots,
        "kv_move_rows: slot {} -> {} out of a pool of {}", from_slots[i], to_slots[i], slots);
  if (n == 0) return;
  std::vector<KvMoveLayer> layers(size_t(lay.num_layers));
  for (int l = 0; l < lay.num_layers; ++l) {
    KvMoveLayer& m = layers[size_t(l)];
    m.k = static_cast<char*>(kv.k(l).data);
    m.v = lay.v_dim > 0 ? static_cast<char*>(kv.v(l).data) : nullptr;
    m.k_row_bytes = lay.k_row_bytes(l);
    m.v_row_bytes = lay.v_dim > 0 ? lay.v_row_bytes(l) : 0;
    CHECK_MSG(m.k_row_bytes % 4 == 0 && m.v_row_bytes % 4 == 0 &&
                  reinterpret_cast<uintptr_t>(m.k) % 4 == 0 &&
                  reinterpret_cast<uintptr_t>(m.v) % 4 == 0,
              "kv_move_rows: layer {} rows of {} and {} bytes are not 4-byte words", l,
              m.k_row_bytes, m.v_row_bytes);
  }
  auto p = zeroed<KvMoveParams>();
  p.layers = reinterpret_cast<const KvMoveLayer*>(
      stage_i32(reinterpret_cast<const int32_t*>(layers.data()), int64_t(layers.size()) * 8));
  CHECK(reinterpret_cast<uintptr_t>(p.layers) % 8 == 0);
  p.from = stage_i32(from_slots, n);
  p.to = stage_i32(to_slots, n);
  p.n = n;
  p.num_layers = lay.num_layers;
  record(kOpKvMove, p, launch_kv_move);
}

}  // namespace strata::cuda
