// Row and column copies of the CUDA backend and their host entries (copies.h): embedding,
// gather_rows, slice_columns (consecutive slices of one tensor merge into one launch in graph
// mode) and copy_columns. Memory-bound; elements widened to 16 bytes where alignment allows.
#include <algorithm>

#include "backend/cuda/common.cuh"
#include "backend/cuda/copies.h"
#include "backend/cuda/cuda_backend.h"

namespace strata::cuda {
namespace {

constexpr int kThreads = 256;

int grid_for(int64_t n) { return int(std::min<int64_t>(ceil_div(n, kThreads), 1 << 20)); }

template <typename T>
__global__ void copy_rows_kernel(CopyRowsParams p) {
  pdl_wait();
  pdl_trigger();
  const int64_t n = p.n * p.width;
  const T* x = static_cast<const T*>(p.x);
  T* out = static_cast<T*>(p.out);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / p.width, c = i - r * p.width;
    const int64_t src_row = p.rows ? p.rows[r] : r;
    out[r * p.out_stride + p.out_begin + c] = x[src_row * p.x_stride + p.x_begin + c];
  }
}

template <typename T>
__global__ void multi_slice_kernel(MultiSliceParams p) {
  pdl_wait();
  pdl_trigger();
  const int seg = blockIdx.y;
  const int64_t width = p.width[seg], n = p.n * width;
  const T* x = static_cast<const T*>(p.x) + p.x_begin[seg];
  T* out = static_cast<T*>(p.out[seg]);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / width, c = i - r * width;
    out[i] = x[r * p.x_stride + c];
  }
}

}  // namespace

void launch_copy_rows(const CopyRowsParams& p, const Launch& launch) {
  if (p.n * p.width == 0) return;
  // Widen the element to 16 bytes when every offset and stride allows it.
  CopyRowsParams q = p;
  for (int wide : {16, 8, 4}) {
    if (wide <= p.elem_bytes) break;
    const int f = wide / p.elem_bytes;
    if (p.x_stride % f == 0 && p.out_stride % f == 0 && p.x_begin % f == 0 &&
        p.out_begin % f == 0 && p.width % f == 0 && uintptr_t(p.x) % wide == 0 &&
        uintptr_t(p.out) % wide == 0) {
      q.x_stride /= f;
      q.out_stride /= f;
      q.x_begin /= f;
      q.out_begin /= f;
      q.width /= f;
      q.elem_bytes = wide;
      break;
    }
  }
  const int grid = grid_for(q.n * q.width);
  switch (q.elem_bytes) {
    case 16:
      launch_pdl(copy_rows_kernel<uint4>, grid, kThreads, 0, launch, q);
      break;
    case 8:
      launch_pdl(copy_rows_kernel<uint2>, grid, kThreads, 0, launch, q);
      break;
    case 4:
      launch_pdl(copy_rows_kernel<uint32_t>, grid, kThreads, 0, launch, q);
      break;
    case 2:
      launch_pdl(copy_rows_kernel<uint16_t>, grid, kThreads, 0, launch, q);
      break;
    case 1:
      launch_pdl(copy_rows_kernel<uint8_t>, grid, kThreads, 0, launch, q);
      break;
    default:
      CHECK_MSG(false, "copy_rows: element of {} bytes", q.elem_bytes);
  }
  CUDA_LAUNCH_CHECK();
}

void launch_multi_slice(const MultiSliceParams& p, const Launch& launch) {
  int64_t widest = 0;
  for (int i = 0; i < p.count; ++i) widest = std::max(widest, p.width[i]);
  if (p.n * widest == 0) return;
  MultiSliceParams q = p;
  // 16-byte elements when every offset allows (Q/K/V slices of head_dim multiples do).
  const int f = 16 / p.elem_bytes;
  bool wide = p.elem_bytes < 16 && p.x_stride % f == 0 && uintptr_t(p.x) % 16 == 0;
  for (int i = 0; i < p.count; ++i)
    wide = wide && p.x_begin[i] % f == 0 && p.width[i] % f == 0 && uintptr_t(p.out[i]) % 16 == 0;
  if (wide) {
    q.x_stride /= f;
    for (int i = 0; i < q.count; ++i) {
      q.x_begin[i] /= f;
      q.width[i] /= f;
    }
    q.elem_bytes = 16;
    widest /= f;
  }
  const dim3 grid(unsigned(grid_for(q.n * widest)), unsigned(q.count));
  switch (q.elem_bytes) {
    case 16:
      launch_pdl(multi_slice_kernel<uint4>, grid, dim3(kThreads), 0, launch, q);
      break;
    case 4:
      launch_pdl(multi_slice_kernel<uint32_t>, grid, dim3(kThreads), 0, launch, q);
      break;
    case 2:
      launch_pdl(multi_slice_kernel<uint16_t>, grid, dim3(kThreads), 0, launch, q);
      break;
    default:
      CHECK_MSG(false, "multi_slice: element of {} bytes", q.elem_bytes);
  }
}

// ---- host entries ----
void CudaBackend::embedding(const int32_t* ids, int num_tokens, const Tensor& table,
                            const Tensor& out) {
  const int64_t vocab = table.dim(0), h = table.dim(1);
  CHECK_EQ(out.dim(0), num_tokens);
  CHECK(out.dtype == table.dtype);
  for (int t = 0; t < num_tokens; ++t)
    CHECK_MSG(ids[t] >= 0 && ids[t] < vocab, "token id {} outside vocab {}", ids[t], vocab);
  if (num_tokens == 0) return;
  const int32_t* dev_ids = stage_i32(ids, num_tokens);
  auto p = zeroed<CopyRowsParams>();
  p.x = table.data;
  p.out = out.data;
  p.rows = dev_ids;
  p.n = num_tokens;
  p.x_stride = p.out_stride = p.width = h;
  p.elem_bytes = dtype_size(table.dtype);
  record(kOpCopyRows, p, launch_copy_rows);
}

void CudaBackend::gather_rows(const Tensor& x, const int32_t* rows, int n, const Tensor& out) {
  CHECK_EQ(out.dim(0), n);
  CHECK(out.dtype == x.dtype);
  const int64_t h = x.dim(-1);
  for (int i = 0; i < n; ++i) CHECK_LT(rows[i], x.dim(0));
  if (n == 0) return;
  const int32_t* dev_rows = stage_i32(rows, n);
  auto p = zeroed<CopyRowsParams>();
  p.x = x.data;
  p.out = out.data;
  p.rows = dev_rows;
  p.n = n;
  p.x_stride = p.out_stride = p.width = h;
  p.elem_bytes = dtype_size(x.dtype);
  record(kOpCopyRows, p, launch_copy_rows);
}

void CudaBackend::slice_columns(const Tensor& x, int64_t begin, int64_t end, const Tensor& out) {
  const int64_t rows = x.dim(0), cols = x.numel() / rows, w = end - begin;
  CHECK(0 <= begin && begin <= end && end <= cols);
  CHECK_EQ(out.numel(), rows * w);
  CHECK(out.dtype == x.dtype);
  begin_op();
  const int eb = dtype_size(x.dtype);
  if (recorder_.graph_mode()) {
    // Consecutive slices of one tensor (Q, K, V of a fused projection) share one launch.
    MultiSliceParams m;
    const bool merge = recorder_.last(kOpSlice, &m) && m.x == x.data && m.n == rows &&
                       m.x_stride == cols && m.elem_bytes == eb && m.count < kMaxSlices;
    if (merge) {
      recorder_.drop_last();
    } else {
      m = zeroed<MultiSliceParams>();
      m.x = x.data;
      m.n = rows;
      m.x_stride = cols;
      m.elem_bytes = eb;
    }
    m.out[m.count] = out.data;
    m.x_begin[m.count] = begin;
    m.width[m.count] = w;
    ++m.count;
    record(kOpSlice, m, launch_multi_slice);
    return;
  }
  auto p = zeroed<CopyRowsParams>();
  p.x = x.data;
  p.out = out.data;
  p.n = rows;
  p.x_stride = cols;
  p.out_stride = w;
  p.x_begin = begin;
  p.width = w;
  p.elem_bytes = eb;
  record(kOpCopyRows, p, launch_copy_rows);
}

void CudaBackend::copy_columns(const Tensor& x, int64_t begin, int64_t end, const Tensor& out,
                               int64_t out_begin) {
  const int64_t cx = x.dim(-1), co = out.dim(-1), rows = x.numel() / cx, w = end - begin;
  CHECK(0 <= begin && begin <= end && end <= cx);
  CHECK(0 <= out_begin && out_begin + w <= co);
  CHECK_EQ(out.numel() / co, rows);
  CHECK(out.dtype == x.dtype);
  begin_op();
  auto p = zeroed<CopyRowsParams>();
  p.x = x.data;
  p.out = out.data;
  p.n = rows;
  p.x_stride = cx;
  p.out_stride = co;
  p.x_begin = begin;
  p.out_begin = out_begin;
  p.width = w;
  p.elem_bytes = dtype_size(x.dtype);
  record(kOpCopyRows, p, launch_copy_rows);
}

}  // namespace strata::cuda
