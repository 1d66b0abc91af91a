// CaptureBlock: host memory for one step's captured hidden-state rows, filled by the model
// runner's download (engine/model_runner.h) and stored by the capture writer
// (engine/capture_writer.h), then reused. Unlike a std::vector it keeps its allocation without
// zero-filling (resize() within the capacity only sets the size: the download overwrites the
// rows) and can be page-locked by the backend (backend/host_pinning.h), so the device copies the
// rows straight into it. Issue 25: an 8B capture job moves ~33 GB of rows; through pageable memory
// each byte was copied into the backend's pinned staging buffer and then again on the host.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>

#include "backend/host_pinning.h"

namespace strata {

class CaptureBlock {
 public:
  CaptureBlock() = default;
  CaptureBlock(CaptureBlock&& other) noexcept
      : data_(std::move(other.data_)),
        pin_(std::move(other.pin_)),
        size_(other.size_),
        capacity_(other.capacity_) {
    other.size_ = other.capacity_ = 0;
  }
  CaptureBlock& operator=(CaptureBlock&& other) noexcept {
    if (this == &other) return *this;
    pin_.reset();  // unpinned before the memory it covers is freed
    data_ = std::move(other.data_);
    pin_ = std::move(other.pin_);
    size_ = other.size_;
    capacity_ = other.capacity_;
    other.size_ = other.capacity_ = 0;
    return *this;
  }
  CaptureBlock(const CaptureBlock&) = delete;
  CaptureBlock& operator=(const CaptureBlock&) = delete;
  ~CaptureBlock() { pin_.reset(); }

  uint8_t* data() { return data_.get(); }
  const uint8_t* data() const { return data_.get(); }
  size_t size() const { return size_; }
  size_t capacity() const { return capacity_; }
  bool pinned() const { return pin_ != nullptr; }

  // Sets the size to `n` bytes. Within the capacity nothing else happens (the bytes are whatever
  // the block last held). Beyond it the block reallocates, keeping none of its bytes, at least
  // 1.5 times larger (a later, larger step does not reallocate again) and, given the backend's
  // pinning, page-locks the new memory (one registration per growth, not per step).
  void resize(size_t n, HostPinning* pinning = nullptr) {
    if (n > capacity_) {
      const size_t want = std::max(n, capacity_ + capacity_ / 2);
      const size_t bytes = (want + kAlign - 1) / kAlign * kAlign;
      pin_.reset();
      data_.reset();
      capacity_ = 0;
      data_.reset(static_cast<uint8_t*>(std::aligned_alloc(kAlign, bytes)));
      if (data_ == nullptr) throw std::bad_alloc();
      capacity_ = bytes;
      if (pinning != nullptr) pin_ = pinning->pin_host(data_.get(), capacity_);
    }
    size_ = n;
  }

 private:
  static constexpr size_t kAlign = 4096;
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  // data_ before pin_: members go in reverse order, so the pin is released first.
  std::unique_ptr<uint8_t, Free> data_;
  std::shared_ptr<void> pin_;  // HostPinning::pin_host's handle; null: pageable
  size_t size_ = 0, capacity_ = 0;
};

}  // namespace strata
