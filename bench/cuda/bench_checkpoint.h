// Random-weight checkpoints of a real model's shape for the CUDA benchmarks, in the checkpoint's
// stored format (bf16, INT4 pack-quantized, fp8 block: whatever the config's
// quantization_config says), with the tensor names of the weight-name registry
// (model/inventory.h, model/weight_names.h). The safetensors file is written sparse (zeros:
// instant, no disk) except the INT4 `weight_shape` tensors the loader reads; it is loaded through
// the normal loader and the device copies are then filled with random values
// (CudaBackend::fill_all_random): timings never see zeros. write_random_checkpoint writes the
// values into the file instead, for programs that load a checkpoint themselves (`strata
// generate`): the same distribution as fill_all_random, so both see the same routing.
#pragma once

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/status.h"
#include "model/config.h"
#include "model/inventory.h"

namespace strata {

struct CheckpointTensor {
  std::string name;
  const char* dtype;  // safetensors dtype: "BF16", "F32", "I32", "F8_E4M3"
  std::vector<int64_t> shape;
  std::vector<int32_t> values;  // written as is (INT4 weight_shape); empty: zeros
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
      out.push_back({names[1],
                     "F32",
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
inline int64_t write_safetensors_header(std::ofstream& f,
                                        const std::vector<CheckpointTensor>& tensors) {
  nlohmann::json header = nlohmann::json::object();
  int64_t off = 0;
  for (const CheckpointTensor& t : tensors) {
    header[t.name] = {
        {"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {off, off + t.bytes()}}};
    off += t.bytes();
  }
  std::string h = header.dump();
  while (h.size() % 8) h.push_back(' ');
  const uint64_t n = h.size();
  f.write(reinterpret_cast<const char*>(&n), 8);
  f.write(h.data(), std::streamsize(h.size()));
  return off;
}

// Copies `config_path` into `dir` (made if missing) and returns the stored tensors of its model.
inline std::vector<CheckpointTensor> checkpoint_tensors_for(const std::string& config_path,
                                                            const std::string& dir) {
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(config_path, dir + "/config.json",
                             std::filesystem::copy_options::overwrite_existing);
  auto spec = load_model_spec(dir);
  CHECK_MSG(spec.ok(), "{}", spec.status().to_string());
  return checkpoint_tensors(*spec);
}

// Writes `dir`/model.safetensors with every tensor of `config_path`'s model in its stored
// format, zero but for INT4 weight_shape, and copies the config. Returns the bytes of weights
// in the file (values + scales).
inline int64_t write_zero_checkpoint(const std::string& config_path, const std::string& dir) {
  const std::vector<CheckpointTensor> tensors = checkpoint_tensors_for(config_path, dir);
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

// The values of write_random_checkpoint: `bytes` of one safetensors dtype, drawn like
// CudaBackend::fill_all_random's (uniform in ±scale for floats; any bits for packed INT4; FP8
// e4m3 values of the same range, never the NaN code).
inline std::vector<char> random_pool(const char* dtype, size_t bytes, uint64_t seed, float scale) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<char> pool(bytes);
  const std::string d = dtype;
  if (d == "BF16") {
    for (size_t i = 0; i + 2 <= bytes; i += 2) {
      const float v = u(rng);
      uint32_t b;
      std::memcpy(&b, &v, 4);
      const uint16_t h = uint16_t((b + 0x7fff + ((b >> 16) & 1)) >> 16);  // round to nearest even
      std::memcpy(&pool[i], &h, 2);
    }
  } else if (d == "F32") {
    for (size_t i = 0; i + 4 <= bytes; i += 4) {
      const float v = u(rng);
      std::memcpy(&pool[i], &v, 4);
    }
  } else if (d == "F8_E4M3") {
    for (size_t i = 0; i < bytes; ++i) {
      uint8_t b = uint8_t(rng());
      if ((b & 0x7f) == 0x7f) b &= 0xfe;  // 0x7f / 0xff are NaN in e4m3
      pool[i] = char(b);
    }
  } else {  // I32: packed INT4 nibbles, any bits
    for (size_t i = 0; i < bytes; ++i) pool[i] = char(rng());
  }
  return pool;
}

// Writes `dir`/model.safetensors with every tensor of `config_path`'s model in its stored format
// filled with random values (random_pool's; INT4 weight_shape as it must be), and copies the
// config. Values repeat every 64 MiB per dtype (drawn once): enough for timings and for routing,
// which sees distinct router rows and embeddings well inside that. Returns the weight bytes.
inline int64_t write_random_checkpoint(const std::string& config_path, const std::string& dir,
                                       uint64_t seed = 42, float scale = 0.02f) {
  const std::vector<CheckpointTensor> tensors = checkpoint_tensors_for(config_path, dir);
  std::ofstream f(dir + "/model.safetensors", std::ios::binary | std::ios::trunc);
  write_safetensors_header(f, tensors);
  constexpr size_t kPool = size_t(64) << 20;
  std::vector<std::pair<std::string, std::vector<char>>> pools;
  auto pool_of = [&](const char* dtype) -> const std::vector<char>& {
    for (auto& p : pools)
      if (p.first == dtype) return p.second;
    pools.emplace_back(dtype, random_pool(dtype, kPool, seed + pools.size(), scale));
    return pools.back().second;
  };
  int64_t weight_bytes = 0;
  size_t pos = 0;  // where the next tensor starts in its pool (a multiple of 4: element-aligned)
  for (const CheckpointTensor& t : tensors) {
    if (!t.values.empty()) {
      f.write(reinterpret_cast<const char*>(t.values.data()), std::streamsize(t.values.size() * 4));
      continue;
    }
    const std::vector<char>& pool = pool_of(t.dtype);
    for (int64_t left = t.bytes(); left > 0;) {
      const size_t n = std::min(size_t(left), kPool - pos);
      f.write(pool.data() + pos, std::streamsize(n));
      left -= int64_t(n);
      pos = (pos + n) % kPool;
    }
    pos = (pos + 4096) % kPool & ~size_t(3);  // the next tensor starts elsewhere in the pool
    weight_bytes += t.bytes();
  }
  CHECK_MSG(f.good(), "writing {}/model.safetensors failed (disk full?)", dir);
  return weight_bytes;
}

}  // namespace strata
