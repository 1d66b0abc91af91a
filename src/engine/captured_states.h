// CapturedStates: the hidden states the model runner captured for one request (the model's
// CaptureSpec, ForwardBatch::captured), kept by position in the request's token sequence so that a
// recomputation (a retraction, a resumed prefill) simply writes the same rows again.
//
// The caller of Engine::submit creates it (GenerateRequest::capture) and reads it after the
// request's finished event; the engine thread writes it in between (the event orders the two).
//
// With a RowSpill attached, each row's first spill->prefix_bytes() go to the spill as they are
// written (a capture job streams them into the record's file while it generates) and only the
// rest of the row stays in memory: row() then returns that rest.
//
// keep_written() turns later writes of positions already written into no-ops: a capture job's
// one-token tail request (pipeline/engine_capture.cc) recomputes the record's last page but must
// only add its last position, and captures straight into the record's states that way (a
// separate CapturedStates for the tail grew to the record's whole length, tens of MB zero-filled
// per record on the capture writer's thread: issue 25's stall when hundreds finish together).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "core/dtype.h"

namespace strata {

// Where the leading bytes of captured rows go instead of memory (pipeline/hidden_store.h).
class RowSpill {
 public:
  virtual ~RowSpill() = default;
  // Bytes of each row's start it takes, in the states' dtype.
  virtual int64_t prefix_bytes() const = 0;
  // Stores the prefix of row `pos`. Called from the engine's threads, one row of a request at a
  // time; a failure is kept and reported when the record is stored.
  virtual void write(int64_t pos, const uint8_t* prefix) = 0;
};

class CapturedStates {
 public:
  // `dtype`: how rows are kept, kBF16 (the model dtype, half the memory) or kF32 (exact float).
  explicit CapturedStates(DType dtype = DType::kBF16, std::shared_ptr<RowSpill> spill = nullptr)
      : dtype_(dtype), spill_(std::move(spill)) {}

  DType dtype() const { return dtype_; }
  int64_t width() const { return width_; }  // elements per row (states x hidden size)
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
  // The spill taking each row's prefix, or null (whole rows in memory).
  RowSpill* spill() const { return spill_.get(); }
  // Bytes of each row at the start that the spill took (0 without one).
  int64_t spilled_bytes() const { return spill_ ? spill_->prefix_bytes() : 0; }
  // Row `pos` as kept in memory: its bytes from spilled_bytes() on (the whole row, `width()`
  // elements of dtype(), without a spill).
  const uint8_t* row(int64_t pos) const { return data_.data() + size_t(pos * kept_bytes()); }

  // Capacity for rows [0, n), so that growing never copies (a request's length is known). Only
  // reserved: the memory is touched as rows arrive.
  void reserve(int64_t n, int64_t width) {
    if (width_ == 0) width_ = width;
    filled_.reserve(size_t(n));
    data_.reserve(size_t(n * kept_bytes()));
  }

  // From now on put() ignores positions already written (see the top). Set before the rows that
  // must not overwrite are handed to the engine (its submit orders the two).
  void keep_written() { keep_written_ = true; }

  // Writes row `pos` from `width` values of `src_dtype` (kF32 or kBF16; converted to dtype()).
  void put(int64_t pos, const void* values, DType src_dtype, int64_t width) {
    if (keep_written_ && has(pos)) return;
    if (width_ == 0) width_ = width;
    if (pos >= rows())  // within the capacity (reserve()) row by row, else doubling
      grow(pos < int64_t(filled_.capacity()) ? pos + 1 : std::max(pos + 1, 2 * rows()));
    const int64_t row_bytes = width_ * element_bytes();
    const uint8_t* row = static_cast<const uint8_t*>(values);
    if (src_dtype != dtype_) {  // converted into scratch first
      thread_local std::vector<uint8_t> scratch;
      scratch.resize(size_t(row_bytes));
      convert(values, scratch.data());  // src_dtype is the other one
      row = scratch.data();
    }
    const int64_t spilled = spilled_bytes();
    if (spilled > 0) spill_->write(pos, row);
    std::memcpy(data_.data() + size_t(pos * kept_bytes()), row + spilled,
                size_t(row_bytes - spilled));
    filled_[size_t(pos)] = 1;
  }
  // Copies row `pos` of `other` (same dtype and width, whole rows in memory) into this one.
  void put_row(int64_t pos, const CapturedStates& other) {
    put(pos, other.row(pos), other.dtype_, other.width_);
  }
  // Keeps positions [0, n) only.
  void truncate(int64_t n) {
    if (n >= rows()) return;
    filled_.resize(size_t(n));
    data_.resize(size_t(n * kept_bytes()));
  }

 private:
  int64_t kept_bytes() const { return width_ * element_bytes() - spilled_bytes(); }
  void grow(int64_t n) {
    filled_.resize(size_t(n), 0);
    data_.resize(size_t(n * kept_bytes()));
  }
  void convert(const void* values, uint8_t* dst) const {
    if (dtype_ == DType::kBF16) {  // from float32
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
  }

  DType dtype_;
  std::shared_ptr<RowSpill> spill_;
  int64_t width_ = 0;
  std::vector<uint8_t> data_;    // [rows, width] of dtype_, less each row's spilled prefix
  std::vector<uint8_t> filled_;  // per position: written
  bool keep_written_ = false;    // keep_written(): positions written once stay as they are
};

}  // namespace strata
