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

// Whether the device byte ranges [a, a + a_bytes) and [b, b + b_bytes) share a byte: graph mode's
// launch merges (linear.cu, norm_prologue.cc, moe.cu) keep a merged launch's outputs apart from
// what it reads. A null b overlaps nothing.
inline bool byte_ranges_overlap(const void* a, int64_t a_bytes, const void* b, int64_t b_bytes) {
  const auto a0 = uintptr_t(a), b0 = uintptr_t(b);
  return b != nullptr && a != nullptr && a0 < b0 + uint64_t(b_bytes) && b0 < a0 + uint64_t(a_bytes);
}

// How long a block lives. Transient blocks (a step's activations, load-time scratch) are rounded
// up to a size class and cached for reuse; resident blocks (weights, tables: allocated once, kept
// until the model goes) take their exact size and go straight back to the driver when freed. A
// size class rounds up by as much as a quarter: on one Kimi-K2.5 rank's 76 GB of weights that was
// ~10 GB the planner did not count.
enum class Lifetime { kTransient, kResident };

// Device memory, cached by size class (size_class) and reused last-freed-first. Returns cached
// memory to the driver only when an allocation would otherwise fail, or when asked (trim).
class DevicePool {
 public:
  DevicePool() = default;
  DevicePool(const DevicePool&) = delete;
  DevicePool& operator=(const DevicePool&) = delete;
  ~DevicePool();
  void* alloc(size_t bytes, Lifetime lifetime = Lifetime::kTransient);
  void release(void* ptr, size_t bytes, Lifetime lifetime = Lifetime::kTransient);
  size_t bytes_reserved() const { return reserved_; }
  size_t bytes_cached() const { return cached_; }  // transient blocks free for reuse
  // Frees every cached block (alloc does this once before failing for lack of memory).
  void trim();
  void set_on_trim(std::function<void()> fn) { on_trim_ = std::move(fn); }
  static size_t size_class(size_t bytes);
  int64_t mallocs() const { return mallocs_; }  // cudaMalloc calls (a cache miss each)
  int64_t trims() const { return trims_; }      // cache flushes (each synchronizes the device)
  // While deferring, released transient blocks wait in a list instead of the cache, and go back
  // to it at resume_releases in release order (the same sequence of calls still gives the same
  // addresses). A side branch (backend/cuda/side_branch.cc) defers until its join: a block freed
  // by one stream's work must not be handed to the other stream's while both may run.
  void defer_releases() { deferring_ = true; }
  void resume_releases();
  // Every allocation and its size (benchmarks fill them with random values).
  const std::vector<std::pair<void*, size_t>>& allocations() const { return owned_; }

 private:
  std::unordered_map<size_t, std::vector<void*>> free_;
  std::vector<std::pair<void*, size_t>> owned_;
  size_t reserved_ = 0, cached_ = 0;
  int64_t mallocs_ = 0, trims_ = 0;
  std::function<void()> on_trim_;
  bool deferring_ = false;
  std::vector<std::pair<void*, size_t>> deferred_;  // (block, bytes) released while deferring
};

class CudaTensor : public DeviceTensor {
 public:
  CudaTensor(std::shared_ptr<DevicePool> pool, DType dtype, const Shape& shape,
             Lifetime lifetime = Lifetime::kTransient);
  ~CudaTensor() override;

 private:
  std::shared_ptr<DevicePool> pool_;
  size_t bytes_ = 0;
  Lifetime lifetime_;
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
