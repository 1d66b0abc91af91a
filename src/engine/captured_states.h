// CapturedStates: the hidden states the model runner captured for one request (the model's
// CaptureSpec, ForwardBatch::captured), kept by position in the request's token sequence so that a
// recomputation (a retraction, a resumed prefill) simply writes the same rows again.
//
// The caller of Engine::submit creates it (GenerateRequest::capture) and reads it after the
// request's finished event; the engine thread writes it in between (the event orders the two).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/dtype.h"

namespace strata {

class CapturedStates {
 public:
  // `dtype`: how rows are kept, kBF16 (the model dtype, half the memory) or kF32 (exact float).
  explicit CapturedStates(DType dtype = DType::kBF16) : dtype_(dtype) {}

  DType dtype() const { return dtype_; }
  int64_t width() const { return width_; }  // floats per row (states x hidden size)
  int64_t rows() const { return int64_t(filled_.size()); }
  bool has(int64_t pos) const { return pos < rows() && filled_[size_t(pos)] != 0; }
  // Positions [0, n) all written.
  bool complete(int64_t n) const {
    if (rows() < n) return false;
    for (int64_t p = 0; p < n; ++p)
      if (filled_[size_t(p)] == 0) return false;
    return true;
  }
  int64_t element_bytes() const { return dtype_ == DType::kF32 ? 4 : 2; }
  // Row `pos`, `width()` elements of dtype().
  const uint8_t* row(int64_t pos) const {
    return data_.data() + size_t(pos * width_ * element_bytes());
  }
  const std::vector<uint8_t>& bytes() const { return data_; }

  // Writes row `pos` from `width` values of `src_dtype` (kF32 or kBF16; converted to dtype()).
  void put(int64_t pos, const void* values, DType src_dtype, int64_t width) {
    if (width_ == 0) width_ = width;
    if (pos >= rows()) {
      filled_.resize(size_t(std::max(pos + 1, 2 * rows())), 0);
      data_.resize(filled_.size() * size_t(width_ * element_bytes()));
    }
    uint8_t* dst = data_.data() + size_t(pos * width_ * element_bytes());
    if (src_dtype == dtype_) {
      std::memcpy(dst, values, size_t(width_ * element_bytes()));
    } else if (dtype_ == DType::kBF16) {  // from float32
      const float* f = static_cast<const float*>(values);
      for (int64_t i = 0; i < width_; ++i) {
        const uint16_t b = f32_to_bf16(f[i]);
        std::memcpy(dst + 2 * i, &b, 2);
      }
    } else {  // float32 from bf16
      const uint16_t* h = static_cast<const uint16_t*>(values);
      float* f = reinterpret_cast<float*>(dst);
      for (int64_t i = 0; i < width_; ++i) f[i] = bf16_to_f32(h[i]);
    }
    filled_[size_t(pos)] = 1;
  }
  // Copies row `pos` of `other` (same dtype and width) into this one.
  void put_row(int64_t pos, const CapturedStates& other) {
    if (width_ == 0) width_ = other.width_;
    if (pos >= rows()) {
      filled_.resize(size_t(std::max(pos + 1, 2 * rows())), 0);
      data_.resize(filled_.size() * size_t(width_ * element_bytes()));
    }
    std::memcpy(data_.data() + size_t(pos * width_ * element_bytes()), other.row(pos),
                size_t(width_ * element_bytes()));
    filled_[size_t(pos)] = 1;
  }
  // Keeps positions [0, n) only.
  void truncate(int64_t n) {
    if (n >= rows()) return;
    filled_.resize(size_t(n));
    data_.resize(size_t(n * width_ * element_bytes()));
  }

 private:
  DType dtype_;
  int64_t width_ = 0;
  std::vector<uint8_t> data_;    // [rows, width] of dtype_
  std::vector<uint8_t> filled_;  // per position: written
};

}  // namespace strata
