// How a linear layer's weight matrix is stored, in a checkpoint and on a device, and the one
// formula for its bytes (used by the capacity planner and by the loaders alike, so `strata plan`
// promises exactly what a backend that keeps the format allocates).
//
// Formats (logical weight [out, in], y = x · wᵀ):
// - kDense: out × in values of one float dtype (bf16, f16, f32).
// - kFp8Block: DeepSeek-V3 fp8. values e4m3 [out, in]; scales float32
//   [ceil(out / block_out), ceil(in / block_in)] (`weight_scale_inv`): w = value · scale.
// - kInt4Group: compressed-tensors `pack-quantized`, symmetric. values int32 [out, ceil(in / 8)],
//   8 nibbles per word along the input dim, least significant first, w = (nibble − 8) · scale;
//   scales bf16 [out, in / group_size] (`weight_scale`).
//
// A HostLinearWeight may stack `stack` such matrices along a leading dim (the routed experts of
// one MoE layer: [num_experts, out, in]); each matrix keeps its own scales.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/host_bytes.h"
#include "core/status.h"

namespace strata {

enum class WeightFormat : uint8_t { kDense, kFp8Block, kInt4Group };
inline constexpr EnumName<WeightFormat> kWeightFormatNames[] = {
    {WeightFormat::kDense, "dense"},
    {WeightFormat::kFp8Block, "fp8_block"},
    {WeightFormat::kInt4Group, "int4_group"}};
constexpr const auto& enum_names(WeightFormat) { return kWeightFormatNames; }
inline const char* weight_format_name(WeightFormat f) { return enum_name(f).data(); }

struct LinearFormat {
  WeightFormat format = WeightFormat::kDense;
  DType dense_dtype = DType::kBF16;  // kDense: element type of the values
  int group_size = 0;                // kInt4Group: input elements per scale (32, 64, 128)
  int block_out = 0;                 // kFp8Block: rows per scale block (128)
  int block_in = 0;                  // kFp8Block: columns per scale block (128)

  // Spelled out: the CUDA sources compile as C++17 (no defaulted comparisons).
  bool operator==(const LinearFormat& o) const {
    return format == o.format && dense_dtype == o.dense_dtype && group_size == o.group_size &&
           block_out == o.block_out && block_in == o.block_in;
  }
  // "bf16", "fp8 block 128x128", "int4 group 32".
  std::string str() const;
};

// Bytes of one [out, in] matrix's values / scales / both in `f`. The planner and the loaders use
// these; a backend that keeps the format allocates exactly linear_weight_bytes per matrix.
int64_t linear_values_bytes(const LinearFormat& f, int64_t out, int64_t in);
int64_t linear_scales_bytes(const LinearFormat& f, int64_t out, int64_t in);
inline int64_t linear_weight_bytes(const LinearFormat& f, int64_t out, int64_t in) {
  return linear_values_bytes(f, out, in) + linear_scales_bytes(f, out, in);
}

// What a backend keeps of each stored format: packed formats it has kernels for stay packed,
// the rest is dequantized to `dense_dtype` at upload (as is every dense weight).
struct WeightPolicy {
  DType dense_dtype = DType::kBF16;
  bool keep_fp8_block = false;
  bool keep_int4 = false;
  // The format a weight stored as `stored` takes on such a backend.
  LinearFormat device_format(const LinearFormat& stored) const;
};

// Bytes a backend that keeps `f` packed allocates for one [out, in] matrix: the stored bytes plus
// the padding of the CUDA layouts — INT4 in tiles of 16 rows × 64 inputs (backend/cuda/
// linear_int4.h; none for real shapes: out % 16 == 0 and in % 64 == 0), fp8 scale rows padded to
// a multiple of 4 floats (cuBLASLt's block-scaled GEMM reads them 16 bytes at a time). Dense:
// the stored bytes.
int64_t linear_device_bytes(const LinearFormat& f, int64_t out, int64_t in);

// A linear weight's stored bytes in host memory, as read from a checkpoint (or a shard of it):
// what Backend::upload_linear receives. Owns its bytes (a loader's come from its HostBytePool).
// Layout: `stack` matrices one after the other, values then (separately) scales, each matrix laid
// out as the file header describes.
struct HostLinearWeight {
  LinearFormat format;
  int64_t stack = 1;
  int64_t out = 0;
  int64_t in = 0;
  HostBytes values;  // stack × linear_values_bytes(format, out, in)
  HostBytes scales;  // stack × linear_scales_bytes(format, out, in); empty when dense

  int64_t matrix_values_bytes() const { return linear_values_bytes(format, out, in); }
  int64_t matrix_scales_bytes() const { return linear_scales_bytes(format, out, in); }
  int64_t bytes() const { return stack * linear_weight_bytes(format, out, in); }
  // Checks that the buffers hold exactly what format and dims say (CHECK-fails otherwise).
  void check_sizes() const;
};

// Float32 values of every matrix, [stack, out, in] row-major, rounding as the references do:
// int4 (nibble − 8) · scale rounded to bf16; fp8 value · scale in float32 rounded to bf16
// (DeepSeek's weight_dequant); dense values converted exactly.
void dequantize_linear(const HostLinearWeight& w, float* dst);

// A rectangle of a row-major byte table: rows [row_begin, row_end) × bytes [byte_begin, byte_end)
// of rows of `row_bytes` bytes.
struct ByteBlock {
  int64_t row_bytes = 0;
  int64_t row_begin = 0, row_end = 0;
  int64_t byte_begin = 0, byte_end = 0;
  int64_t rows() const { return row_end - row_begin; }
  int64_t width() const { return byte_end - byte_begin; }
  int64_t bytes() const { return rows() * width(); }
  // Copies rows [r0, r1) of the block (0 <= r0 <= r1 <= rows()) out of `table` (the table's
  // first byte) to `dst`, packed: the block's row r lands at dst + (r - r0) · width().
  void copy_rows(const uint8_t* table, int64_t r0, int64_t r1, uint8_t* dst) const;
};

// Where the stored bytes of rows [r0, r1) × columns [c0, c1) of one [out, in] matrix in format
// `f` lie: a block of its values table and one of its scales table (empty when dense), which
// packed one after the other are that slice's own stored form. The one slicing rule of
// slice_linear_rows / slice_linear_cols and the loaders (model/weights.h). Checks: the ranges
// inside the matrix; a range short of the whole dim must fall on fp8 scale blocks (end may be the
// dim) or INT4 groups. Errors name `what`.
struct LinearSlice {
  int64_t out = 0, in = 0;  // the slice's dims
  ByteBlock values, scales;
};
StatusOr<LinearSlice> linear_slice(const LinearFormat& f, int64_t out, int64_t in, int64_t r0,
                                   int64_t r1, int64_t c0, int64_t c1, const std::string& what);

// Rows [begin, end) of every matrix (a column-parallel shard). fp8: begin and end must fall on
// block_out boundaries (end may be out). Errors name `what`.
StatusOr<HostLinearWeight> slice_linear_rows(const HostLinearWeight& w, int64_t begin, int64_t end,
                                             const std::string& what);
// Columns [begin, end) of every matrix (a row-parallel shard). int4: on group boundaries; fp8: on
// block_in boundaries (end may be in).
StatusOr<HostLinearWeight> slice_linear_cols(const HostLinearWeight& w, int64_t begin, int64_t end,
                                             const std::string& what);
// Stacks parts along the output rows (fused QKV or gate/up): one matrix whose rows are part 0's,
// then part 1's, ... All parts must share format, stack and in; fp8 parts but the last need
// out % block_out == 0 (their scale blocks would straddle parts otherwise). Dense parts of
// different dtypes are widened to float32.
StatusOr<HostLinearWeight> concat_linear_rows(std::vector<HostLinearWeight> parts,
                                              const std::string& what);
// Stacks single matrices (stack == 1 each) along a new leading dim (a MoE layer's experts).
StatusOr<HostLinearWeight> stack_linears(std::vector<HostLinearWeight> parts,
                                         const std::string& what);

// ---- the reference dequantization kernels (float32 out, row-major [out, in]) ----
// packed: [out, packed_cols] int32 (packed_cols >= ceil(in/8)); scale: [out, in / group_size]
// bf16 bits. Work is split over the thread pool.
void dequant_int4_pack_quantized(const uint8_t* packed, int64_t packed_cols, const uint8_t* scale,
                                 int64_t out, int64_t in, int64_t group_size, float* dst);
// w: [out, in] fp8 e4m3; scale_inv: [ceil(out/block_out), ceil(in/block_in)] float32.
void dequant_fp8_block(const uint8_t* w, const uint8_t* scale_inv, int64_t out, int64_t in,
                       int64_t block_out, int64_t block_in, float* dst);

}  // namespace strata
