// Random-weight checkpoints of a real model's shape for the CUDA benchmarks, in the checkpoint's
// stored format (bf16, INT4 pack-quantized, fp8 block: whatever the config's
// quantization_config says), with the tensor names of the weight-name registry
// (model/inventory.h, model/weight_names.h). The safetensors file is written sparse (zeros:
// instant, no disk) except the INT4 `weight_shape` tensors the loader reads; it is loaded through
// the normal loader and the device copies are then filled with random values
// (CudaBackend::fill_all_random): timings never see zeros.
#pragma once

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/status.h"
#include "model/config.h"
#include "model/inventory.h"

namespace strata {

struct CheckpointTensor {
  std::string name;
  const char* dtype;             // safetensors dtype: "BF16", "F32", "I32", "F8_E4M3"
  std::vector<int64_t> shape;
  std::vector<int32_t> values;   // written as is (INT4 weight_shape); empty: zeros
  int64_t bytes() const {
    const int64_t n = std::accumulate(shape.begin(), shape.end(), int64_t(1), std::multiplies<>());
    return std::string(dtype) == "F8_E4M3" ? n : (std::string(dtype) == "BF16" ? 2 * n : 4 * n);
  }
};

// Every stored tensor of `spec`'s checkpoint, in inventory order.
inline std::vector<CheckpointTensor> checkpoint_tensors(const ModelSpec& spec) {
  const QuantLayout layout = quant_layout(spec);
  std::vector<CheckpointTensor> out;
  for (const WeightEntry& w : build_inventory(spec)) {
    const std::vector<std::string> names = stored_tensor_names(w);
    if (w.quant == QuantMethod::kInt4PackQuantized && names.size() == 3) {
      const int64_t o = w.shape[0], i = w.shape[1];
      out.push_back({names[0], "I32", {o, (i + 7) / 8}, {}});
      out.push_back({names[1], "BF16", {o, i / layout.int4_group_size}, {}});
      out.push_back({names[2], "I32", {2}, {int32_t(o), int32_t(i)}});
    } else if (w.quant == QuantMethod::kFp8Block && names.size() == 2) {
      const int64_t o = w.shape[0], i = w.shape[1];
      out.push_back({names[0], "F8_E4M3", w.shape, {}});
      out.push_back({names[1], "F32",
                     {(o + layout.fp8_block_out - 1) / layout.fp8_block_out,
                      (i + layout.fp8_block_in - 1) / layout.fp8_block_in},
                     {}});
    } else {
      out.push_back({w.name, w.dtype == DType::kF32 ? "F32" : "BF16", w.shape, {}});
    }
  }
  return out;
}

// Writes the safetensors header for `tensors` (packed in order) to `f`. Returns the bytes of
// tensor data that must follow it.
inline int64_t write_safetensors_header(std::ofstream& f, const std::vector<CheckpointTensor>& tensors) {
  nlohmann::json header = nlohmann::json::object();
  int64_t off = 0;
  for (const CheckpointTensor& t : tensors) {
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {off, off + t.bytes()}}};
    off += t.bytes();
  }
  std::string h = header.dump();
  while (h.size() % 8) h.push_back(' ');
  const uint64_t n = h.size();
  f.write(reinterpret_cast<const char*>(&n), 8);
  f.write(h.data(), std::streamsize(h.size()));
  return off;
}

// Writes `dir`/model.safetensors with every tensor of `config_path`'s model in its stored
// format, zero but for INT4 weight_shape, and copies the config. Returns the bytes of weights
// in the file (values + scales).
inline int64_t write_zero_checkpoint(const std::string& config_path, const std::string& dir) {
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(config_path, dir + "/config.json",
                             std::filesystem::copy_options::overwrite_existing);
  auto spec = load_model_spec(dir);
  CHECK_MSG(spec.ok(), "{}", spec.status().to_string());
  const std::vector<CheckpointTensor> tensors = checkpoint_tensors(*spec);
  const std::string path = dir + "/model.safetensors";
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  const int64_t data = write_safetensors_header(f, tensors);
  const uint64_t header_end = uint64_t(f.tellp());
  int64_t off = 0, weight_bytes = 0;
  for (const CheckpointTensor& t : tensors) {
    if (!t.values.empty()) {
      f.seekp(std::streamoff(header_end + uint64_t(off)));
      f.write(reinterpret_cast<const char*>(t.values.data()), std::streamsize(t.values.size() * 4));
    } else {
      weight_bytes += t.bytes();
    }
    off += t.bytes();
  }
  f.close();
  std::filesystem::resize_file(path, header_end + uint64_t(data));
  return weight_bytes;
}

}  // namespace strata
