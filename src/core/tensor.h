// Tensor: a non-owning view (pointer, dtype, shape, strides, device). Buffer: owning, aligned
// host memory. Device memory is owned by backends; a Tensor only points at it.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/dtype.h"

namespace strata {

enum class Device : uint8_t { kCpu, kCuda };
inline constexpr EnumName<Device> kDeviceNames[] = {{Device::kCpu, "cpu"}, {Device::kCuda, "cuda"}};
constexpr const auto& enum_names(Device) { return kDeviceNames; }
inline const char* device_name(Device d) { return enum_name(d).data(); }

using Shape = std::vector<int64_t>;

int64_t shape_numel(const Shape& shape);
std::string shape_str(const Shape& shape);

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::kF32;
  Device device = Device::kCpu;
  Shape shape;
  Shape strides;  // in elements; contiguous row-major when built by make()

  // A contiguous view over `data`.
  static Tensor make(void* data, DType dtype, Shape shape, Device device = Device::kCpu);

  int rank() const { return int(shape.size()); }
  int64_t dim(int i) const { return shape[size_t(i < 0 ? i + rank() : i)]; }
  int64_t numel() const { return shape_numel(shape); }
  int64_t nbytes() const { return dtype_bytes_for(dtype, numel()); }
  bool is_contiguous() const;
  bool empty() const { return data == nullptr; }

  template <typename T>
  T* ptr() const {
    return static_cast<T*>(data);
  }
  // Rows [begin, end) along dim 0 of a contiguous tensor.
  Tensor slice_rows(int64_t begin, int64_t end) const;
  // Same data, new contiguous shape with the same numel.
  Tensor reshape(Shape new_shape) const;
};

// Frees a Buffer's memory (munmap for mapped buffers, free otherwise).
struct BufferFree {
  size_t mapped_bytes = 0;  // > 0: the memory came from mmap
  void operator()(void* p) const;
};

// Owning, zeroed, 64-byte aligned host memory. Move-only. Large buffers (>= 1 MiB, e.g. the CPU
// KV pool) come from anonymous mmap, so untouched pages cost nothing until used.
class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(int64_t nbytes);
  Buffer(Buffer&&) noexcept = default;
  Buffer& operator=(Buffer&&) noexcept = default;

  void* data() const { return data_.get(); }
  int64_t nbytes() const { return nbytes_; }
  // A contiguous tensor view of the whole buffer (CHECKs that it fits).
  Tensor as_tensor(DType dtype, Shape shape) const;

 private:
  std::unique_ptr<void, BufferFree> data_;
  int64_t nbytes_ = 0;
};

// A float32 host tensor that owns its storage: the CPU backend's activations and test data.
struct HostTensor {
  Buffer buffer;
  Tensor view;

  HostTensor() = default;
  HostTensor(DType dtype, Shape shape);
  static HostTensor zeros_f32(Shape shape) { return HostTensor(DType::kF32, std::move(shape)); }
  float* f32() const { return view.ptr<float>(); }
  int64_t numel() const { return view.numel(); }
};

}  // namespace strata
