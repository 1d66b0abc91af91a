// WeightStore: every tensor of a checkpoint directory (single `model.safetensors` or sharded
// `model.safetensors.index.json`), memory-mapped, with float32 loading that dequantizes
// quantized weights transparently.
//
// Names: find()/names() see the tensors exactly as stored (`...gate_proj.weight_packed`,
// `...weight_scale`, `...weight_scale_inv`: the raw forms a GPU backend uploads as they are).
// contains()/shape_of()/load_f32() see logical weights: `...gate_proj.weight` exists when it is
// stored plainly or as an INT4 `.weight_packed` + `.weight_scale` pair.
//
// Thread-safety: const methods may be called from any thread once open() returns.
#pragma once

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "core/weight_format.h"
#include "model/safetensors.h"
#include "model/spec.h"

namespace strata {

// One part of a linear weight to read (WeightStore::load_linear_stack): rows [row_begin, row_end)
// × columns [col_begin, col_end) of stored linear weight `name` ("<m>.weight"), whose full logical
// shape must be `shape` [out, in].
struct LinearRead {
  std::string name;
  Shape shape;
  int64_t row_begin = 0, row_end = 0, col_begin = 0, col_end = 0;
  static LinearRead whole(std::string name, const Shape& shape) {
    return LinearRead{.name = std::move(name),
                      .shape = shape,
                      .row_end = shape.at(0),
                      .col_end = shape.size() > 1 ? shape[1] : 1};
  }
};

class WeightStore {
 public:
  // Opens `dir`/model.safetensors, or every shard named by `dir`/model.safetensors.index.json.
  // Errors: missing directory, no checkpoint file, missing shard, a tensor of the weight_map
  // absent from its shard, a tensor name stored twice, and every header corruption
  // SafetensorsFile::open detects. `quant` (from ModelSpec::quant) fixes the INT4 group size and
  // fp8 block size that load_f32 checks against; with kNone they are inferred from scale shapes.
  static StatusOr<WeightStore> open(const std::string& dir, const QuantSpec& quant = {});

  WeightStore(WeightStore&&) noexcept = default;
  WeightStore& operator=(WeightStore&&) noexcept = default;

  const std::string& dir() const { return dir_; }
  // Stored tensor, or nullptr. The raw INT4 form is find(name + "_packed").
  const TensorInfo* find(const std::string& name) const;
  // Logical presence: stored as is, or (for "<m>.weight") stored as "<m>.weight_packed".
  bool contains(const std::string& name) const;
  // Stored tensor names, sorted.
  std::vector<std::string> names() const;
  // Logical shape: [out, in] for a packed INT4 weight (from `weight_shape` when stored).
  StatusOr<Shape> shape_of(const std::string& name) const;
  // True when `name` ("<m>.weight") is stored quantized (INT4 packed or fp8 with block scales).
  bool is_quantized(const std::string& name) const;

  // Loads a weight as float32, converting bf16/f16/f32/fp8 and dequantizing INT4 pack-quantized
  // and fp8 block weights; checks the shape against `expected_shape` (error names tensor, file,
  // expected and actual shapes). Costs a full copy: for CPU inference and tests.
  StatusOr<HostTensor> load_f32(const std::string& name, const Shape& expected_shape) const;
  // Same, without a shape check.
  StatusOr<HostTensor> load_f32(const std::string& name) const;
  // A linear weight ("<m>.weight", logical shape [out, in] = expected_shape) as stored: dense
  // (bf16/f16/f32, converted to nothing), fp8 e4m3 with its `weight_scale_inv` block scales, or
  // INT4 pack-quantized with its `weight_scale` (core/weight_format.h): the bytes a backend
  // uploads as they are. Errors: as load_f32, plus an asymmetric INT4 weight (a
  // `weight_zero_point`), refused by name.
  StatusOr<HostLinearWeight> load_linear(const std::string& name,
                                         const Shape& expected_shape) const;
  // `matrices.size()` matrices stacked along a leading dim (a MoE layer's experts; stack 1: one
  // linear), matrix s being the parts matrices[s] stacked along the output rows (a fused QKV or
  // gate/up), each part a slice of a stored linear weight (a tensor-parallel shard): the same
  // bytes and errors as load_linear + slice_linear_rows / slice_linear_cols + concat_linear_rows +
  // stack_linears (core/weight_format.h), without their copies: every byte is copied once, from
  // the mapping straight to its place, spread over the thread pool, into memory from this
  // store's pool (recycled when the weight dies). Dense parts of different dtypes take the
  // composed path (widened to float32, as concat_linear_rows does). `what` names the stack in
  // errors.
  StatusOr<HostLinearWeight> load_linear_stack(const std::vector<std::vector<LinearRead>>& matrices,
                                               const std::string& what) const;

  // Rows [row_begin, row_end) × columns [col_begin, col_end) of a 2-D weight (a 1-D tensor: rows
  // only, cols {0, 1}) whose full shape must be `expected_shape`: a tensor-parallel rank's shard
  // (model/sharding.h). Plain bf16/f16/f32 weights read only the slice from the mapping, so a
  // rank never holds the whole tensor; quantized weights dequantize whole, then keep the slice.
  StatusOr<HostTensor> load_f32_slice(const std::string& name, const Shape& expected_shape,
                                      int64_t row_begin, int64_t row_end, int64_t col_begin,
                                      int64_t col_end) const;

 private:
  WeightStore() = default;
  Status add_file(std::unique_ptr<SafetensorsFile> file);
  StatusOr<HostTensor> load_int4(const std::string& name, const TensorInfo& packed) const;
  // The INT4 group size of `name` after checking packed/scale shapes against [out, in].
  StatusOr<int64_t> int4_group(const std::string& name, const TensorInfo& packed, int64_t out,
                               int64_t in) const;
  // fp8 block dims {out, in} after checking the scale tensor against w's shape.
  StatusOr<std::pair<int64_t, int64_t>> fp8_blocks(const TensorInfo& w,
                                                   const TensorInfo& scale) const;
  StatusOr<HostTensor> load_fp8_block(const TensorInfo& w, const TensorInfo& scale) const;
  StatusOr<HostTensor> load_plain(const TensorInfo& t) const;
  // A stored linear weight's tensors, format and the slice `r` asks for (shape and format
  // checks as load_linear's).
  struct LinearSource;
  StatusOr<LinearSource> linear_source(const LinearRead& r) const;

  std::string dir_;
  QuantSpec quant_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;  // own the mappings TensorInfo points into
  std::unordered_map<std::string, const TensorInfo*> by_name_;
  std::shared_ptr<HostBytePool> pool_;  // load_linear_stack's buffers, reused layer after layer
};

}  // namespace strata
