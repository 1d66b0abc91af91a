// One safetensors file, memory-mapped read-only, with its header fully validated at open time.
//
// Format: 8-byte little-endian header length N, N bytes of JSON
// {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}},
// then the data; offsets are relative to the first byte after the header.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "core/tensor.h"

namespace strata {

// A tensor as stored in a checkpoint: raw bytes inside an mmapped file. The pointer stays valid
// as long as the SafetensorsFile (or the WeightStore owning it) lives.
struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  const uint8_t* data = nullptr;  // mmapped bytes, read-only; `nbytes` long
  int64_t nbytes = 0;
  std::string file;  // path of the file holding it (for error messages)

  int64_t numel() const { return shape_numel(shape); }
};

class SafetensorsFile {
 public:
  // Maps `path` and validates the header: length vs file size, JSON, dtype names, shape x dtype
  // size == end - begin, offsets inside the data section, no two tensors overlapping. Errors
  // name the file and the tensor. Cost: one mmap + header parse; data pages load lazily.
  static StatusOr<std::unique_ptr<SafetensorsFile>> open(const std::string& path);

  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  // Sorted by data offset.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  int64_t file_bytes() const { return file_bytes_; }

 private:
  SafetensorsFile() = default;
  Status parse_header(const std::string& header, int64_t data_begin);

  std::string path_;
  void* map_ = nullptr;
  int64_t file_bytes_ = 0;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// Writes a safetensors file (tests and tools that make small checkpoints). Tensors are laid out
// in the given order; the header is padded to a multiple of 8 bytes as the reference writer does.
struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  std::vector<uint8_t> bytes;  // exactly dtype_bytes_for(dtype, numel) long
};
Status write_safetensors(const std::string& path, const std::vector<SafetensorsEntry>& entries);

}  // namespace strata
