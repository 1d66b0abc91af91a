#include "backend/cpu/cpu_backend.h"

#include <cstring>
#include <vector>

#include "backend/kv_format.h"
#include "core/check.h"

namespace strata {

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<cpu::CpuBackend>(); }

namespace cpu {

CpuKvStorage::CpuKvStorage(const KvLayout& layout) : KvStorage(layout) {
  for (int l = 0; l < layout.num_layers; ++l) {
    const DType dt = layout.layer_dtype(l);
    if (layout.k_row_is_split(l))  // raw rows: backend/kv_format.h
      k_.emplace_back(DType::kU8, Shape{layout.num_pages, layout.page_size, layout.k_row_bytes(l)});
    else
      k_.emplace_back(dt, Shape{layout.num_pages, layout.page_size, layout.k_dim});
    v_.emplace_back(dt, Shape{layout.num_pages, layout.page_size, layout.v_dim});
  }
}

DeviceTensorPtr CpuBackend::alloc(DType dtype, const Shape& shape) {
  return std::make_unique<CpuTensor>(dtype, shape);
}

DeviceTensorPtr CpuBackend::upload(const Tensor& host, DType dtype) {
  auto t = std::make_unique<CpuTensor>(dtype, host.shape);
  upload_to(host, t->view());
  return t;
}

void CpuBackend::upload_to(const Tensor& host, const Tensor& dst) {
  CHECK(host.is_contiguous() && dst.is_contiguous());
  CHECK_MSG(host.dtype == DType::kF32 || host.dtype == DType::kBF16 || host.dtype == DType::kF16,
            "upload: host tensors are float32, bf16 or f16, not {}", dtype_name(host.dtype));
  const int64_t n = host.numel();
  CHECK_EQ(n, dst.numel());
  const DType dtype = dst.dtype;
  if (host.dtype == dtype) {
    std::memcpy(dst.data, host.data, size_t(host.nbytes()));
  } else if (host.dtype == DType::kF32) {
    from_f32(dtype, host.ptr<float>(), dst.data, n);
  } else if (dtype == DType::kF32) {
    to_f32(host.dtype, host.data, dst.ptr<float>(), n);
  } else {
    std::vector<float> wide(static_cast<size_t>(n));
    to_f32(host.dtype, host.data, wide.data(), n);
    from_f32(dtype, wide.data(), dst.data, n);
  }
}

void CpuBackend::download_f32(const Tensor& src, float* dst) {
  CHECK(src.is_contiguous());
  to_f32(src.dtype, src.data, dst, src.numel());
}

std::unique_ptr<KvStorage> CpuBackend::alloc_kv(const KvLayout& layout) {
  return std::make_unique<CpuKvStorage>(layout);
}

void CpuBackend::gather_rows(const Tensor& x, const int32_t* rows, int n, const Tensor& out) {
  CHECK_EQ(out.dim(0), n);
  const int64_t h = x.dim(-1);
  for (int i = 0; i < n; ++i) {
    CHECK_LT(rows[i], x.dim(0));
    std::memcpy(out.ptr<float>() + i * h, x.ptr<float>() + int64_t(rows[i]) * h, size_t(h) * 4);
  }
}

void CpuBackend::slice_columns(const Tensor& x, int64_t begin, int64_t end, const Tensor& out) {
  const int64_t rows = x.dim(0), cols = x.numel() / rows, w = end - begin;
  CHECK(0 <= begin && begin <= end && end <= cols);
  CHECK_EQ(out.numel(), rows * w);
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(out.ptr<float>() + r * w, x.ptr<float>() + r * cols + begin, size_t(w) * 4);
}

void CpuBackend::embedding(const int32_t* ids, int num_tokens, const Tensor& table,
                           const Tensor& out) {
  const int64_t vocab = table.dim(0), h = table.dim(1);
  CHECK_EQ(out.dim(0), num_tokens);
  for (int t = 0; t < num_tokens; ++t) {
    CHECK_MSG(ids[t] >= 0 && ids[t] < vocab, "token id {} outside vocab {}", ids[t], vocab);
    std::memcpy(out.ptr<float>() + t * h, table.ptr<float>() + int64_t(ids[t]) * h, size_t(h) * 4);
  }
}

void load_kv_row(DType dtype, const void* row, int64_t n, float scale, float* dst) {
  decode_plain_row(dtype, row, n, scale, dst);
}

void store_kv_row(DType dtype, const float* src, int64_t n, float scale, void* row) {
  encode_plain_row(dtype, src, n, scale, row);
}

void CpuBackend::kv_write(KvStorage& kv, int layer, const Tensor& k, const Tensor& v,
                          const AttentionMetadata& meta) {
  const KvLayout& lay = kv.layout();
  const DType dt = lay.layer_dtype(layer);
  Tensor kc = kv.k(layer), vc = kv.v(layer);
  const int64_t row_k = lay.k_row_bytes(layer), row_v = lay.v_row_bytes(layer);
  for (int t = 0; t < meta.num_tokens; ++t) {
    const int64_t slot = meta.slot_mapping[t];
    CHECK_MSG(slot >= 0 && slot < lay.num_pages * lay.page_size, "slot {} out of pool", slot);
    encode_k_row(lay, layer, k.ptr<float>() + t * lay.k_dim, kv.k_scale(layer),
                 static_cast<char*>(kc.data) + slot * row_k);
    if (lay.v_dim > 0)
      store_kv_row(dt, v.ptr<float>() + t * lay.v_dim, lay.v_dim, kv.v_scale(layer),
                   static_cast<char*>(vc.data) + slot * row_v);
  }
}

void CpuBackend::kv_move_rows(KvStorage& kv, const int32_t* from_slots, const int32_t* to_slots,
                              int n) {
  const KvLayout& lay = kv.layout();
  const int64_t slots = int64_t(lay.num_pages) * lay.page_size;
  for (int i = 0; i < n; ++i)
    CHECK_MSG(
        from_slots[i] >= 0 && from_slots[i] < slots && to_slots[i] >= 0 && to_slots[i] < slots,
        "kv_move_rows: slot {} -> {} out of a pool of {}", from_slots[i], to_slots[i], slots);
  for (int layer = 0; layer < lay.num_layers; ++layer) {
    const int64_t row_k = lay.k_row_bytes(layer), row_v = lay.v_row_bytes(layer);
    char* k = static_cast<char*>(kv.k(layer).data);
    char* v = lay.v_dim > 0 ? static_cast<char*>(kv.v(layer).data) : nullptr;
    for (int i = 0; i < n; ++i) {
      std::memmove(k + to_slots[i] * row_k, k + from_slots[i] * row_k, size_t(row_k));
      if (v != nullptr)
        std::memmove(v + to_slots[i] * row_v, v + from_slots[i] * row_v, size_t(row_v));
    }
  }
}

}  // namespace cpu
}  // namespace strata
