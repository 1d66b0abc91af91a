// The CUDA backend's memory: the caching device pool behind every tensor, the paged KV storage,
// and the pinned staging of a step's host inputs.
//
// Two properties keep graph replays valid (graph_recorder.h): the pool hands out the same
// addresses for the same sequence of allocations (LIFO per size class), and staging offsets
// restart at every step, so a step's device addresses depend only on its shapes.
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backend/backend.h"

namespace strata::cuda {

// Device memory, cached by size class (size_class) and reused last-freed-first. Returns cached
// memory to the driver only when an allocation would otherwise fail (trim).
class DevicePool {
 public:
  DevicePool() = default;
  DevicePool(const DevicePool&) = delete;
  DevicePool& operator=(const DevicePool&) = delete;
  ~DevicePool();
  void* alloc(size_t bytes);
  void release(void* ptr, size_t bytes);
  size_t bytes_reserved() const { return reserved_; }
  // Frees every cached block (alloc does this once before failing for lack of memory).
  void trim();
  void set_on_trim(std::function<void()> fn) { on_trim_ = std::move(fn); }
  static size_t size_class(size_t bytes);
  int64_t mallocs() const { return mallocs_; }  // cudaMalloc calls (a cache miss each)
  int64_t trims() const { return trims_; }      // cache flushes (each synchronizes the device)
  // Every allocation and its size (benchmarks fill them with random values).
  const std::vector<std::pair<void*, size_t>>& allocations() const { return owned_; }

 private:
  std::unordered_map<size_t, std::vector<void*>> free_;
  std::vector<std::pair<void*, size_t>> owned_;
  size_t reserved_ = 0;
  int64_t mallocs_ = 0, trims_ = 0;
  std::function<void()> on_trim_;
};

class CudaTensor : public DeviceTensor {
 public:
  CudaTensor(std::shared_ptr<DevicePool> pool, DType dtype, const Shape& shape);
  ~CudaTensor() override;

 private:
  std::shared_ptr<DevicePool> pool_;
  size_t bytes_ = 0;
};

// bf16, fp8_e4m3 and fp8_e5m2 layers (mixed allowed), MLA rows included: fp8 latents with the
// rope part in the layer's dtype, in bf16 / fp8 / f32 (--kv-mla-rope-dtype), or FlashMLA rows
// (mla_attention.h); refuses every other dtype, and MLA rows whose rope part (or FlashMLA tile
// scales) would sit at an address not a multiple of its element size.
Status check_cuda_kv_layout(const KvLayout& layout);

class CudaKvStorage : public KvStorage {
 public:
  explicit CudaKvStorage(const KvLayout& layout);
  ~CudaKvStorage() override;
  Tensor k(int layer) const override { return k_[size_t(layer)]; }
  Tensor v(int layer) const override { return v_[size_t(layer)]; }

 private:
  void* memory_ = nullptr;
  // per layer [num_pages, page_size, k_dim | v_dim] of the layer's dtype; split MLA K rows: kU8
  // [num_pages, page_size, k_row_bytes]
  std::vector<Tensor> k_, v_;
};

// Pinned host memory mirrored by device memory: the per-step host inputs. Offsets restart at
// every step, so a step's layout depends only on the order and sizes of what it stages.
class Staging {
 public:
  explicit Staging(size_t capacity_bytes);
  ~Staging();
  void reset() {
    used_ = 0;
    entries_.clear();
  }
  // Reserves `bytes` (256-byte aligned); returns the offset.
  size_t reserve(size_t bytes);
  char* host(size_t offset) const { return host_ + offset; }
  char* device(size_t offset) const { return device_ + offset; }
  // A staged int32 array whose contents equal host[0..n), or -1.
  int64_t find(const int32_t* host, int64_t n) const;
  void remember(size_t offset, int64_t n) { entries_.push_back({offset, n}); }
  size_t capacity() const { return capacity_; }

 private:
  struct Entry {
    size_t offset;
    int64_t n;
  };
  char* host_ = nullptr;
  char* device_ = nullptr;
  size_t capacity_ = 0, used_ = 0;
  std::vector<Entry> entries_;
};

}  // namespace strata::cuda
