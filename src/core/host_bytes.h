// HostBytes: the host memory a weight's bytes travel in from a checkpoint to a backend
// (HostLinearWeight's values and scales, core/weight_format.h). A byte array with the parts of
// std::vector<uint8_t>'s interface the code uses (resize zero-fills, copies are deep), plus
// uninitialized buffers taken from a HostBytePool, which gets the memory back when the HostBytes
// dies.
//
// Why a pool: loading writes every byte of a checkpoint into fresh host buffers, one or a few per
// layer, each freed after its upload. Fresh memory costs a page fault and a zeroing per 4 KiB page
// (on the machines measured, more than the copy itself: bench/load_bench.cc); a pool hands the
// next layer the pages the last one used, already mapped.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace strata {

// Blocks of host memory recycled between HostBytes. Thread-safe. Blocks below kMinPooledBytes are
// not pooled (malloc reuses small blocks well on its own).
class HostBytePool {
 public:
  static constexpr size_t kMinPooledBytes = size_t(1) << 20;
  // Keeps at most `max_cached_bytes` of returned blocks (the largest go first beyond that).
  explicit HostBytePool(size_t max_cached_bytes = size_t(8) << 30)
      : max_cached_(max_cached_bytes) {}
  ~HostBytePool();
  HostBytePool(const HostBytePool&) = delete;
  HostBytePool& operator=(const HostBytePool&) = delete;

  // A block of at least `bytes` (contents unspecified): the smallest cached one that fits and is
  // at most twice as large, else a new mapping. *capacity receives its size.
  void* take(size_t bytes, size_t* capacity);
  void give(void* block, size_t capacity);
  size_t cached_bytes() const;
  int64_t fresh_blocks() const;  // blocks mapped so far (cache misses)

  // Memory of HostBytes made without a pool: new mappings, unmapped when given back.
  static void* map_block(size_t bytes);
  static void unmap_block(void* block, size_t capacity);

 private:
  mutable std::mutex mu_;
  std::vector<std::pair<size_t, void*>> free_;  // (capacity, block)
  size_t cached_ = 0;
  size_t max_cached_;
  int64_t fresh_ = 0;
};

class HostBytes {
 public:
  HostBytes() = default;
  // `n` zero bytes.
  explicit HostBytes(size_t n) { resize(n); }
  HostBytes(const uint8_t* first, const uint8_t* last);
  HostBytes(const HostBytes& o) : HostBytes(o.begin(), o.end()) {}
  HostBytes(HostBytes&& o) noexcept { swap(o); }
  HostBytes& operator=(const HostBytes& o);
  HostBytes& operator=(HostBytes&& o) noexcept {
    HostBytes(std::move(o)).swap(*this);
    return *this;
  }
  ~HostBytes() { release(); }

  // `n` bytes whose contents are unspecified (the caller writes all of them), from `pool` when
  // given (kept alive by the HostBytes), else plain memory.
  static HostBytes uninitialized(size_t n, const std::shared_ptr<HostBytePool>& pool = nullptr);

  uint8_t* data() { return data_; }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  uint8_t& operator[](size_t i) { return data_[i]; }
  const uint8_t& operator[](size_t i) const { return data_[i]; }
  uint8_t* begin() { return data_; }
  uint8_t* end() { return data_ + size_; }
  const uint8_t* begin() const { return data_; }
  const uint8_t* end() const { return data_ + size_; }
  // Keeps the first min(n, size()) bytes; new bytes are zero (as std::vector's resize).
  void resize(size_t n);
  bool operator==(const HostBytes& o) const;
  void swap(HostBytes& o) noexcept;

 private:
  void release();
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  size_t capacity_ = 0;
  bool mapped_ = false;  // from a pool or map_block (else malloc)
  std::shared_ptr<HostBytePool> pool_;
};

}  // namespace strata
