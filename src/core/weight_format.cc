#include "core/weight_format.h"

#include <fmt/format.h>

#include <cstring>

#include "core/check.h"
#include "core/thread_pool.h"

namespace strata {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Bytes of one row of a matrix's values / scales (every format here stores row-major rows).
int64_t values_row_bytes(const LinearFormat& f, int64_t in) {
  switch (f.format) {
    case WeightFormat::kDense:
      return dtype_bytes_for(f.dense_dtype, in);
    case WeightFormat::kFp8Block:
      return in;
    case WeightFormat::kInt4Group:
      return ceil_div(in, 8) * 4;
  }
  return 0;
}

}  // namespace

std::string LinearFormat::str() const {
  switch (format) {
    case WeightFormat::kDense:
      return dtype_name(dense_dtype);
    case WeightFormat::kFp8Block:
      return fmt::format("fp8 block {}x{}", block_out, block_in);
    case WeightFormat::kInt4Group:
      return fmt::format("int4 group {}", group_size);
  }
  return "?";
}

int64_t linear_values_bytes(const LinearFormat& f, int64_t out, int64_t in) {
  return out * values_row_bytes(f, in);
}

int64_t linear_scales_bytes(const LinearFormat& f, int64_t out, int64_t in) {
  switch (f.format) {
    case WeightFormat::kDense:
      return 0;
    case WeightFormat::kFp8Block:
      return ceil_div(out, f.block_out) * ceil_div(in, f.block_in) * 4;
    case WeightFormat::kInt4Group:
      return out * ceil_div(in, f.group_size) * 2;
  }
  return 0;
}

LinearFormat WeightPolicy::device_format(const LinearFormat& stored) const {
  if ((stored.format == WeightFormat::kFp8Block && keep_fp8_block) ||
      (stored.format == WeightFormat::kInt4Group && keep_int4))
    return stored;
  return LinearFormat{.format = WeightFormat::kDense, .dense_dtype = dense_dtype};
}

int64_t linear_device_bytes(const LinearFormat& f, int64_t out, int64_t in) {
  switch (f.format) {
    case WeightFormat::kDense:
      return linear_weight_bytes(f, out, in);
    case WeightFormat::kFp8Block:
      return out * in +
             ceil_div(out, f.block_out) * (ceil_div(ceil_div(in, f.block_in), 4) * 4) * 4;
    case WeightFormat::kInt4Group: {
      const int64_t rows = ceil_div(out, 16) * 16, cols = ceil_div(in, 64) * 64;
      return rows * cols / 2 + rows * ceil_div(cols, f.group_size) * 2;
    }
  }
  return 0;
}

void HostLinearWeight::check_sizes() const {
  CHECK_MSG(stack >= 1 && out >= 1 && in >= 1, "linear weight dims stack {} out {} in {}", stack,
            out, in);
  if (format.format == WeightFormat::kFp8Block) CHECK(format.block_out > 0 && format.block_in > 0);
  if (format.format == WeightFormat::kInt4Group)
    CHECK(format.group_size > 0 && in % format.group_size == 0);
  CHECK_EQ(int64_t(values.size()), stack * matrix_values_bytes());
  CHECK_EQ(int64_t(scales.size()), stack * matrix_scales_bytes());
}

void dequantize_linear(const HostLinearWeight& w, float* dst) {
  w.check_sizes();
  const int64_t n = w.out * w.in;
  for (int64_t s = 0; s < w.stack; ++s) {
    const uint8_t* v = w.values.data() + s * w.matrix_values_bytes();
    const uint8_t* sc = w.scales.data() + s * w.matrix_scales_bytes();
    float* d = dst + s * n;
    switch (w.format.format) {
      case WeightFormat::kDense: {
        const int64_t esize = dtype_size(w.format.dense_dtype);
        parallel_for(n, 1 << 16, [&](int64_t b, int64_t e) {
          to_f32(w.format.dense_dtype, v + b * esize, d + b, e - b);
        });
        break;
      }
      case WeightFormat::kFp8Block:
        dequant_fp8_block(v, sc, w.out, w.in, w.format.block_out, w.format.block_in, d);
        break;
      case WeightFormat::kInt4Group:
        dequant_int4_pack_quantized(v, ceil_div(w.in, 8), sc, w.out, w.in, w.format.group_size, d);
        break;
    }
  }
}

void ByteBlock::copy_rows(const uint8_t* table, int64_t r0, int64_t r1, uint8_t* dst) const {
  const int64_t w = width();
  const uint8_t* src = table + (row_begin + r0) * row_bytes + byte_begin;
  if (w == row_bytes) {  // whole rows: one run
    std::memcpy(dst, src, size_t((r1 - r0) * w));
    return;
  }
  for (int64_t r = r0; r < r1; ++r, src += row_bytes, dst += w) std::memcpy(dst, src, size_t(w));
}

StatusOr<LinearSlice> linear_slice(const LinearFormat& f, int64_t out, int64_t in, int64_t r0,
                                   int64_t r1, int64_t c0, int64_t c1, const std::string& what) {
  if (r0 < 0 || r0 >= r1 || r1 > out)
    return invalid_argument("{}: rows [{}, {}) are outside its {} rows", what, r0, r1, out);
  if (c0 < 0 || c0 >= c1 || c1 > in)
    return invalid_argument("{}: columns [{}, {}) are outside its {} columns", what, c0, c1, in);
  // A whole dim is no slice: it needs no alignment.
  const bool row_slice = r0 != 0 || r1 != out, col_slice = c0 != 0 || c1 != in;
  LinearSlice s;
  s.out = r1 - r0;
  s.in = c1 - c0;
  const int64_t vrow = values_row_bytes(f, in);
  s.values = ByteBlock{.row_bytes = vrow, .row_begin = r0, .row_end = r1};
  switch (f.format) {
    case WeightFormat::kDense: {
      const int64_t es = dtype_size(f.dense_dtype);
      s.values.byte_begin = c0 * es;
      s.values.byte_end = c1 * es;
      break;
    }
    case WeightFormat::kFp8Block: {
      const int64_t bo = f.block_out, bi = f.block_in;
      if (row_slice && (r0 % bo != 0 || (r1 % bo != 0 && r1 != out)))
        return invalid_argument(
            "{}: an fp8 block-quantized weight splits only on its {}-row scale blocks; rows [{}, "
            "{}) "
            "do not (choose a tensor-parallel size whose slices are multiples of {})",
            what, bo, r0, r1, bo);
      if (col_slice && (c0 % bi != 0 || (c1 % bi != 0 && c1 != in)))
        return invalid_argument(
            "{}: an fp8 block-quantized weight splits only on its {}-column scale blocks; columns "
            "[{}, {}) do not",
            what, bi, c0, c1);
      s.values.byte_begin = c0;
      s.values.byte_end = c1;
      s.scales = ByteBlock{.row_bytes = ceil_div(in, bi) * 4,
                           .row_begin = r0 / bo,
                           .row_end = ceil_div(r1, bo),
                           .byte_begin = c0 / bi * 4,
                           .byte_end = ceil_div(c1, bi) * 4};
      break;
    }
    case WeightFormat::kInt4Group: {
      const int64_t g = f.group_size;
      if (col_slice && (c0 % g != 0 || c1 % g != 0 || g % 8 != 0))
        return invalid_argument(
            "{}: an INT4 weight of group {} splits only on group boundaries; columns [{}, {}) do "
            "not",
            what, g, c0, c1);
      s.values.byte_begin = col_slice ? c0 / 2 : 0;
      s.values.byte_end = col_slice ? c1 / 2 : vrow;
      s.scales = ByteBlock{.row_bytes = in / g * 2,
                           .row_begin = r0,
                           .row_end = r1,
                           .byte_begin = c0 / g * 2,
                           .byte_end = c1 / g * 2};
      break;
    }
  }
  CHECK_EQ(s.values.bytes(), linear_values_bytes(f, s.out, s.in));
  CHECK_EQ(s.scales.bytes(), linear_scales_bytes(f, s.out, s.in));
  return s;
}

namespace {

// Rows [r0, r1) × columns [c0, c1) of every matrix of `w`.
StatusOr<HostLinearWeight> slice_stack(const HostLinearWeight& w, int64_t r0, int64_t r1,
                                       int64_t c0, int64_t c1, const std::string& what) {
  w.check_sizes();
  STRATA_ASSIGN_OR_RETURN(LinearSlice s, linear_slice(w.format, w.out, w.in, r0, r1, c0, c1, what));
  HostLinearWeight r;
  r.format = w.format;
  r.stack = w.stack;
  r.out = s.out;
  r.in = s.in;
  r.values = HostBytes::uninitialized(size_t(w.stack * s.values.bytes()));
  r.scales = HostBytes::uninitialized(size_t(w.stack * s.scales.bytes()));
  for (int64_t m = 0; m < w.stack; ++m) {
    s.values.copy_rows(w.values.data() + m * w.matrix_values_bytes(), 0, s.values.rows(),
                       r.values.data() + m * s.values.bytes());
    if (s.scales.bytes() > 0)
      s.scales.copy_rows(w.scales.data() + m * w.matrix_scales_bytes(), 0, s.scales.rows(),
                         r.scales.data() + m * s.scales.bytes());
  }
  r.check_sizes();
  return r;
}

}  // namespace

StatusOr<HostLinearWeight> slice_linear_rows(const HostLinearWeight& w, int64_t begin, int64_t end,
                                             const std::string& what) {
  return slice_stack(w, begin, end, 0, w.in, what);
}

StatusOr<HostLinearWeight> slice_linear_cols(const HostLinearWeight& w, int64_t begin, int64_t end,
                                             const std::string& what) {
  return slice_stack(w, 0, w.out, begin, end, what);
}

namespace {

// Widens a dense weight's values to float32 (concat of dense parts of different dtypes).
void widen_to_f32(HostLinearWeight& w) {
  if (w.format.dense_dtype == DType::kF32) return;
  HostBytes f = HostBytes::uninitialized(size_t(w.stack * w.out * w.in * 4));
  to_f32(w.format.dense_dtype, w.values.data(), reinterpret_cast<float*>(f.data()),
         w.stack * w.out * w.in);
  w.values = std::move(f);
  w.format.dense_dtype = DType::kF32;
}

}  // namespace

StatusOr<HostLinearWeight> concat_linear_rows(std::vector<HostLinearWeight> parts,
                                              const std::string& what) {
  CHECK(!parts.empty());
  if (parts.size() == 1) return std::move(parts[0]);
  bool mixed_dense = false;
  for (const HostLinearWeight& p : parts) {
    p.check_sizes();
    if (p.stack != parts[0].stack || p.in != parts[0].in)
      return invalid_argument("{}: fused parts differ in shape ({}×{} vs {}×{})", what, p.out, p.in,
                              parts[0].out, parts[0].in);
    if (p.format.format == WeightFormat::kDense && parts[0].format.format == WeightFormat::kDense) {
      mixed_dense |= p.format.dense_dtype != parts[0].format.dense_dtype;
      continue;
    }
    if (!(p.format == parts[0].format))
      return invalid_argument("{}: fused parts are stored in different formats ({} and {})", what,
                              p.format.str(), parts[0].format.str());
  }
  if (mixed_dense)
    for (HostLinearWeight& p : parts) widen_to_f32(p);
  const LinearFormat f = parts[0].format;
  if (f.format == WeightFormat::kFp8Block)
    for (size_t i = 0; i + 1 < parts.size(); ++i)
      if (parts[i].out % f.block_out != 0)
        return invalid_argument(
            "{}: cannot fuse fp8 block-quantized parts: part {} has {} rows, not a multiple of the "
            "{}-row scale block",
            what, i, parts[i].out, f.block_out);
  HostLinearWeight r;
  r.format = f;
  r.stack = parts[0].stack;
  r.in = parts[0].in;
  for (const HostLinearWeight& p : parts) r.out += p.out;
  // Per matrix of the stack: part 0's rows, part 1's rows, ... (values and scales alike).
  r.values = HostBytes::uninitialized(size_t(r.stack * r.matrix_values_bytes()));
  r.scales = HostBytes::uninitialized(size_t(r.stack * r.matrix_scales_bytes()));
  uint8_t* v = r.values.data();
  uint8_t* sc = r.scales.data();
  for (int64_t s = 0; s < r.stack; ++s)
    for (const HostLinearWeight& p : parts) {
      const int64_t vb = p.matrix_values_bytes(), sb = p.matrix_scales_bytes();
      std::memcpy(v, p.values.data() + s * vb, size_t(vb));
      if (sb > 0) std::memcpy(sc, p.scales.data() + s * sb, size_t(sb));
      v += vb;
      sc += sb;
    }
  r.check_sizes();
  return r;
}

StatusOr<HostLinearWeight> stack_linears(std::vector<HostLinearWeight> parts,
                                         const std::string& what) {
  CHECK(!parts.empty());
  HostLinearWeight r;
  r.format = parts[0].format;
  r.out = parts[0].out;
  r.in = parts[0].in;
  r.stack = int64_t(parts.size());
  for (size_t i = 0; i < parts.size(); ++i) {
    const HostLinearWeight& p = parts[i];
    p.check_sizes();
    if (p.stack != 1 || p.out != r.out || p.in != r.in || !(p.format == r.format))
      return invalid_argument("{}: stacked matrix {} is {} [{}, {}], matrix 0 is {} [{}, {}]", what,
                              i, p.format.str(), p.out, p.in, r.format.str(), r.out, r.in);
  }
  const int64_t vb = r.matrix_values_bytes(), sb = r.matrix_scales_bytes();
  r.values = HostBytes::uninitialized(size_t(r.stack * vb));
  r.scales = HostBytes::uninitialized(size_t(r.stack * sb));
  for (size_t i = 0; i < parts.size(); ++i) {
    std::memcpy(r.values.data() + int64_t(i) * vb, parts[i].values.data(), size_t(vb));
    if (sb > 0) std::memcpy(r.scales.data() + int64_t(i) * sb, parts[i].scales.data(), size_t(sb));
  }
  r.check_sizes();
  return r;
}

void dequant_int4_pack_quantized(const uint8_t* packed, int64_t packed_cols, const uint8_t* scale,
                                 int64_t out, int64_t in, int64_t group_size, float* dst) {
  CHECK(group_size > 0 && in % group_size == 0 && packed_cols * 8 >= in);
  const int64_t groups = in / group_size;
  parallel_for(out, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const uint8_t* prow = packed + r * packed_cols * 4;
      const uint8_t* srow = scale + r * groups * 2;
      float* drow = dst + r * in;
      for (int64_t c = 0; c < in; ++c) {
        uint32_t word;
        std::memcpy(&word, prow + (c / 8) * 4, 4);
        uint32_t nibble = (word >> (4 * (c % 8))) & 0xfu;
        uint16_t s_bits;
        std::memcpy(&s_bits, srow + (c / group_size) * 2, 2);
        // compressed-tensors multiplies in the scale's dtype (bf16): round the product.
        drow[c] = round_to_bf16(float(int4_from_nibble(nibble)) * bf16_to_f32(s_bits));
      }
    }
  });
}

void dequant_fp8_block(const uint8_t* w, const uint8_t* scale_inv, int64_t out, int64_t in,
                       int64_t block_out, int64_t block_in, float* dst) {
  CHECK(block_out > 0 && block_in > 0);
  const int64_t scale_cols = (in + block_in - 1) / block_in;
  parallel_for(out, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const uint8_t* srow = scale_inv + (r / block_out) * scale_cols * 4;
      for (int64_t c = 0; c < in; ++c) {
        float s;
        std::memcpy(&s, srow + (c / block_in) * 4, 4);
        dst[r * in + c] = round_to_bf16(fp8_e4m3_to_f32(w[r * in + c]) * s);
      }
    }
  });
}

}  // namespace strata
