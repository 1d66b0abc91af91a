#include "model/weights.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/thread_pool.h"
#include "model/quant.h"

namespace strata {
namespace {

using json = nlohmann::json;

bool is_regular_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool ends_with_weight(const std::string& name) { return name.ends_with(".weight"); }

// Reads element i of an integer tensor (I32 or I64).
int64_t int_at(const TensorInfo& t, int64_t i) {
  if (t.dtype == DType::kI64) {
    int64_t v;
    std::memcpy(&v, t.data + i * 8, 8);
    return v;
  }
  int32_t v;
  std::memcpy(&v, t.data + i * 4, 4);
  return v;
}

Status check_shape(const TensorInfo& t, const std::string& name, const Shape& actual,
                   const Shape& expected) {
  if (actual == expected) return Status();
  return invalid_argument("{}: tensor '{}': expected shape {}, found {}", t.file, name,
                          shape_str(expected), shape_str(actual));
}

}  // namespace

StatusOr<WeightStore> WeightStore::open(const std::string& dir, const QuantSpec& quant) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) return not_found("model directory '{}' does not exist", dir);
  if (!S_ISDIR(st.st_mode)) return invalid_argument("'{}' is not a directory", dir);

  WeightStore store;
  store.dir_ = dir;
  store.quant_ = quant;
  store.pool_ = std::make_shared<HostBytePool>();
  const std::string single = dir + "/model.safetensors";
  const std::string index = dir + "/model.safetensors.index.json";
  if (is_regular_file(single)) {
    STRATA_ASSIGN_OR_RETURN(auto file, SafetensorsFile::open(single));
    STRATA_RETURN_IF_ERROR(store.add_file(std::move(file)));
    return store;
  }
  if (!is_regular_file(index)) {
    return not_found("{}: no model.safetensors or model.safetensors.index.json", dir);
  }
  std::ifstream in(index);
  std::stringstream ss;
  ss << in.rdbuf();
  json j = json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return invalid_argument("{}: not valid JSON", index);
  auto wm = j.find("weight_map");
  if (!j.is_object() || wm == j.end() || !wm->is_object()) {
    return invalid_argument("{}: field 'weight_map' missing or not an object", index);
  }
  std::vector<std::string> shard_order;
  for (const auto& [name, file] : wm->items()) {
    if (!file.is_string()) {
      return invalid_argument("{}: weight_map['{}'] must be a file name", index, name);
    }
    std::string f = file.get<std::string>();
    if (std::find(shard_order.begin(), shard_order.end(), f) == shard_order.end()) {
      shard_order.push_back(f);
    }
  }
  for (const std::string& f : shard_order) {
    const std::string path = dir + "/" + f;
    if (!is_regular_file(path)) {
      return not_found("{}: shard '{}' is missing (no file {})", index, f, path);
    }
    STRATA_ASSIGN_OR_RETURN(auto file, SafetensorsFile::open(path));
    STRATA_RETURN_IF_ERROR(store.add_file(std::move(file)));
  }
  for (const auto& [name, file] : wm->items()) {
    const TensorInfo* t = store.find(name);
    if (t == nullptr || t->file != dir + "/" + file.get<std::string>()) {
      return data_loss("{}: tensor '{}' is mapped to shard '{}', which does not contain it", index,
                       name, file.get<std::string>());
    }
  }
  return store;
}

Status WeightStore::add_file(std::unique_ptr<SafetensorsFile> file) {
  for (const TensorInfo& t : file->tensors()) {
    auto [it, inserted] = by_name_.emplace(t.name, &t);
    if (!inserted) {
      return data_loss("tensor '{}' is stored twice: in {} and in {}", t.name, it->second->file,
                       t.file);
    }
  }
  files_.push_back(std::move(file));
  return Status();
}

const TensorInfo* WeightStore::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

bool WeightStore::contains(const std::string& name) const {
  return find(name) != nullptr || (ends_with_weight(name) && find(name + "_packed") != nullptr);
}

std::vector<std::string> WeightStore::names() const {
  std::vector<std::string> out;
  out.reserve(by_name_.size());
  for (const auto& [name, t] : by_name_) out.push_back(name);
  std::sort(out.begin(), out.end());
  return out;
}

bool WeightStore::is_quantized(const std::string& name) const {
  if (!ends_with_weight(name)) return false;
  if (find(name) == nullptr) return find(name + "_packed") != nullptr;
  return find(name)->dtype == DType::kFP8E4M3 && find(name + "_scale_inv") != nullptr;
}

StatusOr<Shape> WeightStore::shape_of(const std::string& name) const {
  if (const TensorInfo* t = find(name)) return t->shape;
  const TensorInfo* packed = ends_with_weight(name) ? find(name + "_packed") : nullptr;
  if (packed == nullptr) return not_found("{}: no tensor '{}'", dir_, name);
  if (packed->shape.size() != 2) {
    return data_loss("{}: tensor '{}': packed INT4 weight must be 2-D, found {}", packed->file,
                     packed->name, shape_str(packed->shape));
  }
  if (const TensorInfo* ws = find(name + "_shape")) {
    if ((ws->dtype != DType::kI32 && ws->dtype != DType::kI64) || ws->numel() != 2) {
      return data_loss("{}: tensor '{}': weight_shape must be 2 integers, found {} {}", ws->file,
                       ws->name, dtype_name(ws->dtype), shape_str(ws->shape));
    }
    return Shape{int_at(*ws, 0), int_at(*ws, 1)};
  }
  return Shape{packed->shape[0], packed->shape[1] * 8};
}

StatusOr<HostTensor> WeightStore::load_f32(const std::string& name,
                                           const Shape& expected_shape) const {
  STRATA_ASSIGN_OR_RETURN(Shape actual, shape_of(name));
  const TensorInfo* t = find(name);
  const TensorInfo* where = t != nullptr ? t : find(name + "_packed");
  STRATA_RETURN_IF_ERROR(check_shape(*where, name, actual, expected_shape));
  return load_f32(name);
}

StatusOr<HostTensor> WeightStore::load_f32_slice(const std::string& name,
                                                 const Shape& expected_shape, int64_t row_begin,
                                                 int64_t row_end, int64_t col_begin,
                                                 int64_t col_end) const {
  STRATA_ASSIGN_OR_RETURN(Shape actual, shape_of(name));
  const TensorInfo* t = find(name);
  const TensorInfo* where = t != nullptr ? t : find(name + "_packed");
  STRATA_RETURN_IF_ERROR(check_shape(*where, name, actual, expected_shape));
  const int64_t rows = actual[0], cols = actual.size() == 2 ? actual[1] : 1;
  if (actual.size() > 2 || row_begin < 0 || row_begin > row_end || row_end > rows ||
      col_begin < 0 || col_begin > col_end || col_end > cols)
    return invalid_argument(
        "{}: tensor '{}' of shape {}: slice rows [{}, {}) cols [{}, {}) is outside it", where->file,
        name, shape_str(actual), row_begin, row_end, col_begin, col_end);
  const int64_t out_rows = row_end - row_begin, out_cols = col_end - col_begin;
  const Shape out_shape = actual.size() == 2 ? Shape{out_rows, out_cols} : Shape{out_rows};
  const bool plain = t != nullptr && (t->dtype == DType::kF32 || t->dtype == DType::kBF16 ||
                                      t->dtype == DType::kF16);
  HostTensor out = HostTensor::zeros_f32(out_shape);
  if (plain) {
    const int64_t esize = dtype_size(t->dtype);
    std::vector<uint8_t> row_buf(size_t(out_cols * esize));
    for (int64_t r = 0; r < out_rows; ++r) {
      // memcpy first: the mapping need not be aligned for the element type.
      std::memcpy(row_buf.data(), t->data + ((row_begin + r) * cols + col_begin) * esize,
                  row_buf.size());
      to_f32(t->dtype, row_buf.data(), out.f32() + r * out_cols, out_cols);
    }
    return out;
  }
  STRATA_ASSIGN_OR_RETURN(HostTensor full, load_f32(name));
  for (int64_t r = 0; r < out_rows; ++r)
    std::memcpy(out.f32() + r * out_cols, full.f32() + (row_begin + r) * cols + col_begin,
                size_t(out_cols) * sizeof(float));
  return out;
}

StatusOr<HostTensor> WeightStore::load_f32(const std::string& name) const {
  const TensorInfo* t = find(name);
  if (t == nullptr) {
    const TensorInfo* packed = ends_with_weight(name) ? find(name + "_packed") : nullptr;
    if (packed == nullptr) {
      return not_found("{}: no tensor '{}' ({} tensors stored)", dir_, name, by_name_.size());
    }
    return load_int4(name, *packed);
  }
  switch (t->dtype) {
    case DType::kF32:
    case DType::kBF16:
    case DType::kF16:
    case DType::kFP8E5M2:
      return load_plain(*t);
    case DType::kFP8E4M3: {
      if (!ends_with_weight(name)) return load_plain(*t);
      const TensorInfo* scale = find(name + "_scale_inv");
      if (scale == nullptr) {
        return not_found("{}: fp8 weight '{}' has no block scale tensor '{}_scale_inv'", t->file,
                         name, name);
      }
      return load_fp8_block(*t, *scale);
    }
    default:
      return invalid_argument("{}: tensor '{}' is {}, not a float weight", t->file, name,
                              dtype_name(t->dtype));
  }
}

StatusOr<HostTensor> WeightStore::load_plain(const TensorInfo& t) const {
  HostTensor out = HostTensor::zeros_f32(t.shape);
  const int64_t n = t.numel();
  const int64_t esize = dtype_size(t.dtype);
  const uint8_t* src = t.data;
  // Writers pad the header to 8 bytes, so data is aligned; a file that is not gets copied
  // first rather than read through misaligned pointers.
  std::vector<uint8_t> aligned;
  if (reinterpret_cast<uintptr_t>(src) % uintptr_t(esize) != 0) {
    aligned.assign(src, src + t.nbytes);
    src = aligned.data();
  }
  parallel_for(n, 1 << 16, [&](int64_t b, int64_t e) {
    to_f32(t.dtype, src + b * esize, out.f32() + b, e - b);
  });
  return out;
}

StatusOr<int64_t> WeightStore::int4_group(const std::string& name, const TensorInfo& packed,
                                          int64_t out, int64_t in) const {
  const std::string scale_name = name + "_scale";
  if (packed.dtype != DType::kI32 || packed.shape.size() != 2) {
    return data_loss("{}: tensor '{}': packed INT4 weight must be I32 [out, in/8], found {} {}",
                     packed.file, packed.name, dtype_name(packed.dtype), shape_str(packed.shape));
  }
  const TensorInfo* scale = find(scale_name);
  if (scale == nullptr) {
    return not_found("{}: INT4 weight '{}' has no scale tensor '{}'", packed.file, packed.name,
                     scale_name);
  }
  if (find(name + "_zero_point") != nullptr) {
    return unimplemented("{}: INT4 weight '{}' has a zero point (asymmetric); not supported",
                         packed.file, packed.name);
  }
  if (out != packed.shape[0] || (in + 7) / 8 != packed.shape[1]) {
    return data_loss("{}: tensor '{}': packed shape {} does not hold a [{}, {}] INT4 weight",
                     packed.file, packed.name, shape_str(packed.shape), out, in);
  }
  if (scale->dtype != DType::kBF16 || scale->shape.size() != 2 || scale->shape[0] != out ||
      scale->shape[1] <= 0) {
    return data_loss("{}: tensor '{}': scale must be BF16 [{}, groups], found {} {}", scale->file,
                     scale_name, out, dtype_name(scale->dtype), shape_str(scale->shape));
  }
  int64_t group = 0;
  if (quant_.method == QuantMethod::kInt4PackQuantized) {
    group = quant_.group_size > 0 ? quant_.group_size : in;
  } else {
    if (in % scale->shape[1] != 0) {
      return data_loss("{}: tensor '{}': {} scale groups do not divide the input dim {}",
                       scale->file, scale_name, scale->shape[1], in);
    }
    group = in / scale->shape[1];
  }
  if (in % group != 0) {
    return invalid_argument("{}: tensor '{}': group size {} does not divide the input dim {}",
                            packed.file, packed.name, group, in);
  }
  if (scale->shape[1] != in / group) {
    return data_loss("{}: tensor '{}': expected {} groups of {} per row, scale has {}", scale->file,
                     scale_name, in / group, group, scale->shape[1]);
  }
  return group;
}

StatusOr<HostTensor> WeightStore::load_int4(const std::string& name,
                                            const TensorInfo& packed) const {
  STRATA_ASSIGN_OR_RETURN(Shape shape, shape_of(name));
  const int64_t out = shape[0], in = shape[1];
  STRATA_ASSIGN_OR_RETURN(int64_t group, int4_group(name, packed, out, in));
  HostTensor result = HostTensor::zeros_f32({out, in});
  dequant_int4_pack_quantized(packed.data, packed.shape[1], find(name + "_scale")->data, out, in,
                              group, result.f32());
  return result;
}

StatusOr<std::pair<int64_t, int64_t>> WeightStore::fp8_blocks(const TensorInfo& w,
                                                              const TensorInfo& scale) const {
  if (w.shape.size() != 2) {
    return data_loss("{}: tensor '{}': fp8 block-quantized weight must be 2-D, found {}", w.file,
                     w.name, shape_str(w.shape));
  }
  int64_t bo = 128, bi = 128;  // DeepSeek-V3's block when the config does not say
  if (quant_.method == QuantMethod::kFp8Block && quant_.weight_block_size.size() == 2) {
    bo = quant_.weight_block_size[0];
    bi = quant_.weight_block_size[1];
  }
  const int64_t out = w.shape[0], in = w.shape[1];
  Shape want{(out + bo - 1) / bo, (in + bi - 1) / bi};
  if (scale.dtype != DType::kF32 || scale.shape != want) {
    return data_loss(
        "{}: tensor '{}': block scales for {} with {}x{} blocks must be F32 {}, found {} {}",
        scale.file, scale.name, shape_str(w.shape), bo, bi, shape_str(want),
        dtype_name(scale.dtype), shape_str(scale.shape));
  }
  return std::pair<int64_t, int64_t>{bo, bi};
}

StatusOr<HostTensor> WeightStore::load_fp8_block(const TensorInfo& w,
                                                 const TensorInfo& scale) const {
  STRATA_ASSIGN_OR_RETURN(auto blocks, fp8_blocks(w, scale));
  const int64_t out = w.shape[0], in = w.shape[1];
  HostTensor result = HostTensor::zeros_f32({out, in});
  dequant_fp8_block(w.data, scale.data, out, in, blocks.first, blocks.second, result.f32());
  return result;
}

struct WeightStore::LinearSource {
  const TensorInfo* values = nullptr;
  const TensorInfo* scales = nullptr;  // null when dense
  LinearFormat format;
  LinearSlice slice;
};

StatusOr<WeightStore::LinearSource> WeightStore::linear_source(const LinearRead& r) const {
  const std::string& name = r.name;
  STRATA_ASSIGN_OR_RETURN(Shape actual, shape_of(name));
  const TensorInfo* t = find(name);
  const TensorInfo* packed =
      t == nullptr && ends_with_weight(name) ? find(name + "_packed") : nullptr;
  if (t == nullptr && packed == nullptr) return not_found("{}: no tensor '{}'", dir_, name);
  STRATA_RETURN_IF_ERROR(check_shape(t != nullptr ? *t : *packed, name, actual, r.shape));
  if (actual.size() != 2)
    return invalid_argument("{}: tensor '{}' is {}, not a 2-D linear weight", dir_, name,
                            shape_str(actual));
  const int64_t out = actual[0], in = actual[1];
  LinearSource src;
  if (packed != nullptr) {
    STRATA_ASSIGN_OR_RETURN(int64_t group, int4_group(name, *packed, out, in));
    src.format = LinearFormat{.format = WeightFormat::kInt4Group, .group_size = int(group)};
    src.values = packed;
    src.scales = find(name + "_scale");
  } else if (t->dtype == DType::kFP8E4M3) {
    const TensorInfo* scale = find(name + "_scale_inv");
    if (scale == nullptr)
      return not_found("{}: fp8 weight '{}' has no block scale tensor '{}_scale_inv'", t->file,
                       name, name);
    STRATA_ASSIGN_OR_RETURN(auto blocks, fp8_blocks(*t, *scale));
    src.format = LinearFormat{.format = WeightFormat::kFp8Block,
                              .block_out = int(blocks.first),
                              .block_in = int(blocks.second)};
    src.values = t;
    src.scales = scale;
  } else if (t->dtype == DType::kF32 || t->dtype == DType::kBF16 || t->dtype == DType::kF16) {
    src.format = LinearFormat{.format = WeightFormat::kDense, .dense_dtype = t->dtype};
    src.values = t;
  } else {
    return invalid_argument("{}: tensor '{}' is {}, not a linear weight format strata reads",
                            t->file, name, dtype_name(t->dtype));
  }
  // The tables the slice indexes are the stored tensors, whole.
  CHECK_EQ(src.values->nbytes, linear_values_bytes(src.format, out, in));
  CHECK_EQ(src.scales ? src.scales->nbytes : 0, linear_scales_bytes(src.format, out, in));
  STRATA_ASSIGN_OR_RETURN(src.slice, linear_slice(src.format, out, in, r.row_begin, r.row_end,
                                                  r.col_begin, r.col_end, name));
  return src;
}

StatusOr<HostLinearWeight> WeightStore::load_linear(const std::string& name,
                                                    const Shape& expected_shape) const {
  return load_linear_stack({{LinearRead::whole(name, expected_shape)}}, name);
}

namespace {

// One run of rows of a block, copied from a stored table to its place in the result.
struct CopyTask {
  const ByteBlock* block;
  const uint8_t* table;
  int64_t r0, r1;
  uint8_t* dst;
};

// Splits `block` (from `table` to `dst`) into tasks of about kTaskBytes, so that one big tensor is
// spread over the pool as well as many small ones.
void add_copy_tasks(const ByteBlock& block, const uint8_t* table, uint8_t* dst,
                    std::vector<CopyTask>& tasks) {
  constexpr int64_t kTaskBytes = int64_t(4) << 20;
  if (block.bytes() == 0) return;
  const int64_t rows_per_task = std::max<int64_t>(1, kTaskBytes / block.width());
  for (int64_t r = 0; r < block.rows(); r += rows_per_task) {
    const int64_t r1 = std::min(block.rows(), r + rows_per_task);
    tasks.push_back(CopyTask{&block, table, r, r1, dst + r * block.width()});
  }
}

}  // namespace

StatusOr<HostLinearWeight> WeightStore::load_linear_stack(
    const std::vector<std::vector<LinearRead>>& matrices, const std::string& what) const {
  CHECK(!matrices.empty());
  std::vector<std::vector<LinearSource>> src(matrices.size());
  for (size_t m = 0; m < matrices.size(); ++m) {
    CHECK(!matrices[m].empty());
    for (const LinearRead& r : matrices[m]) {
      STRATA_ASSIGN_OR_RETURN(LinearSource s, linear_source(r));
      src[m].push_back(std::move(s));
    }
  }
  // One layout for every part of every matrix, else the composed path (its errors, or dense
  // parts of different dtypes widened).
  const LinearFormat f = src[0][0].format;
  const int64_t in = src[0][0].slice.in;
  int64_t out = -1;
  bool uniform = true;
  for (const std::vector<LinearSource>& parts : src) {
    int64_t rows = 0;
    for (size_t p = 0; p < parts.size(); ++p) {
      const LinearSource& s = parts[p];
      uniform &= s.format == f && s.slice.in == in;
      if (f.format == WeightFormat::kFp8Block && p + 1 < parts.size())
        uniform &= s.slice.out % f.block_out == 0;
      rows += s.slice.out;
    }
    uniform &= out < 0 || rows == out;
    out = rows;
  }
  if (!uniform) {
    std::vector<HostLinearWeight> stacked;
    for (size_t m = 0; m < matrices.size(); ++m) {
      std::vector<HostLinearWeight> parts;
      for (const LinearRead& r : matrices[m]) {
        STRATA_ASSIGN_OR_RETURN(HostLinearWeight p, load_linear_stack({{r}}, r.name));
        parts.push_back(std::move(p));
      }
      STRATA_ASSIGN_OR_RETURN(HostLinearWeight fused,
                              concat_linear_rows(std::move(parts), matrices[m][0].name));
      stacked.push_back(std::move(fused));
    }
    if (stacked.size() == 1) return std::move(stacked[0]);
    return stack_linears(std::move(stacked), what);
  }
  HostLinearWeight w;
  w.format = f;
  w.stack = int64_t(matrices.size());
  w.out = out;
  w.in = in;
  const int64_t mv = w.matrix_values_bytes(), ms = w.matrix_scales_bytes();
  w.values = HostBytes::uninitialized(size_t(w.stack * mv), pool_);
  w.scales = HostBytes::uninitialized(size_t(w.stack * ms), pool_);
  std::vector<CopyTask> tasks;
  for (int64_t m = 0; m < w.stack; ++m) {
    uint8_t* v = w.values.data() + m * mv;
    uint8_t* sc = w.scales.data() + m * ms;
    for (const LinearSource& s : src[size_t(m)]) {
      add_copy_tasks(s.slice.values, s.values->data, v, tasks);
      v += s.slice.values.bytes();
      if (s.scales != nullptr) add_copy_tasks(s.slice.scales, s.scales->data, sc, tasks);
      sc += s.slice.scales.bytes();
    }
  }
  parallel_for(int64_t(tasks.size()), 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const CopyTask& t = tasks[size_t(i)];
      t.block->copy_rows(t.table, t.r0, t.r1, t.dst);
    }
  });
  w.check_sizes();
  return w;
}

}  // namespace strata
