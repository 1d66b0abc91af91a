#include "core/tensor.h"

#include <fmt/format.h>
#include <sys/mman.h>

#include <cstdlib>
#include <cstring>

namespace strata {

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string shape_str(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

static Shape contiguous_strides(const Shape& shape) {
  Shape st(shape.size());
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    st[i] = s;
    s *= shape[i];
  }
  return st;
}

Tensor Tensor::make(void* data, DType dtype, Shape shape, Device device) {
  Tensor t;
  t.data = data;
  t.dtype = dtype;
  t.device = device;
  t.strides = contiguous_strides(shape);
  t.shape = std::move(shape);
  return t;
}

bool Tensor::is_contiguous() const { return strides == contiguous_strides(shape); }

Tensor Tensor::slice_rows(int64_t begin, int64_t end) const {
  CHECK(is_contiguous());
  CHECK_MSG(0 <= begin && begin <= end && end <= dim(0), "slice [{}, {}) of {}", begin, end,
            shape_str(shape));
  Shape s = shape;
  s[0] = end - begin;
  const int64_t row = numel() / (dim(0) ? dim(0) : 1);
  char* p = static_cast<char*>(data) + dtype_bytes_for(dtype, begin * row);
  return make(p, dtype, std::move(s), device);
}

Tensor Tensor::reshape(Shape new_shape) const {
  CHECK(is_contiguous());
  CHECK_MSG(shape_numel(new_shape) == numel(), "reshape {} -> {}", shape_str(shape),
            shape_str(new_shape));
  return make(data, dtype, std::move(new_shape), device);
}

void BufferFree::operator()(void* p) const {
  if (mapped_bytes > 0) {
    munmap(p, mapped_bytes);
  } else {
    std::free(p);
  }
}

Buffer::Buffer(int64_t nbytes) : nbytes_(nbytes) {
  constexpr size_t kMapThreshold = size_t(1) << 20;
  size_t rounded = (size_t(nbytes) + 63) / 64 * 64;
  if (rounded == 0) rounded = 64;
  if (rounded >= kMapThreshold) {
    void* p = mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK_MSG(p != MAP_FAILED, "host allocation of {} bytes failed", nbytes);
    data_ = std::unique_ptr<void, BufferFree>(p, BufferFree{rounded});
    return;
  }
  void* p = std::aligned_alloc(64, rounded);
  CHECK_MSG(p != nullptr, "host allocation of {} bytes failed", nbytes);
  std::memset(p, 0, rounded);
  data_ = std::unique_ptr<void, BufferFree>(p, BufferFree{0});
}

Tensor Buffer::as_tensor(DType dtype, Shape shape) const {
  CHECK_LE(dtype_bytes_for(dtype, shape_numel(shape)), nbytes_);
  return Tensor::make(data_.get(), dtype, std::move(shape));
}

HostTensor::HostTensor(DType dtype, Shape shape)
    : buffer(dtype_bytes_for(dtype, shape_numel(shape))) {
  view = buffer.as_tensor(dtype, std::move(shape));
}

}  // namespace strata
