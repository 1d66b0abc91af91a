// Element types and exact conversions between them.
//
// fp8 follows the OCP 8-bit floating point spec (OFP8, 2023):
//   e4m3fn: bias 7, no infinities, NaN = S.1111.111, max finite 448.
//   e5m2:   bias 15, IEEE-like infinities and NaNs, max finite 57344.
// float -> fp8 rounds to nearest, ties to even, and saturates: finite values (and infinities)
// beyond the max finite value become ±max. This is the mode KV quantization wants (a rare
// outlier should clip, not poison the cache with NaN). NaN stays NaN.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

#include "core/enum_names.h"

namespace strata {

enum class DType : uint8_t {
  kF32,
  kBF16,
  kF16,
  kFP8E4M3,
  kFP8E5M2,
  kI8,
  kU8,
  kI32,
  kI64,
  kInt4Packed,  // two 4-bit values per byte (or 8 per int32), low nibble first
};

// Bytes per element; kInt4Packed reports 1 (two elements per byte: use dtype_bytes_for()).
int dtype_size(DType t);
// Bytes for n elements (handles packed int4).
int64_t dtype_bytes_for(DType t, int64_t n);
inline constexpr EnumName<DType> kDTypeNames[] = {{DType::kF32, "f32"},
                                                  {DType::kBF16, "bf16"},
                                                  {DType::kF16, "f16"},
                                                  {DType::kFP8E4M3, "fp8_e4m3"},
                                                  {DType::kFP8E5M2, "fp8_e5m2"},
                                                  {DType::kI8, "i8"},
                                                  {DType::kU8, "u8"},
                                                  {DType::kI32, "i32"},
                                                  {DType::kI64, "i64"},
                                                  {DType::kInt4Packed, "int4"}};
constexpr const auto& enum_names(DType) { return kDTypeNames; }
inline const char* dtype_name(DType t) { return enum_name(t).data(); }
// The names safetensors headers use (int4 has none).
inline constexpr EnumName<DType> kSafetensorsDTypeNames[] = {
    {DType::kF32, "F32"},         {DType::kBF16, "BF16"},       {DType::kF16, "F16"},
    {DType::kFP8E4M3, "F8_E4M3"}, {DType::kFP8E5M2, "F8_E5M2"}, {DType::kI8, "I8"},
    {DType::kU8, "U8"},           {DType::kI32, "I32"},         {DType::kI64, "I64"}};
inline std::optional<DType> dtype_from_safetensors(std::string_view name) {
  return enum_from_name_in(kSafetensorsDTypeNames, name);
}

// ---- bf16 ----
inline float bf16_to_f32(uint16_t h) {
  uint32_t bits = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
// Round to nearest even; NaN stays a quiet NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x0040u);
  uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return uint16_t((bits + rounding) >> 16);
}
// f32 -> bf16 -> f32 in one step.
inline float round_to_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

// ---- f16 (IEEE binary16; overflow -> inf as IEEE requires) ----
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// ---- fp8 ----
float fp8_e4m3_to_f32(uint8_t v);
float fp8_e5m2_to_f32(uint8_t v);
uint8_t f32_to_fp8_e4m3(float f);
uint8_t f32_to_fp8_e5m2(float f);
constexpr float kFp8E4M3Max = 448.0f;
constexpr float kFp8E5M2Max = 57344.0f;

// ---- int4 (compressed-tensors pack-quantized: value = nibble - 8) ----
inline int int4_from_nibble(uint32_t nibble) { return int(nibble & 0xf) - 8; }

// Converts n elements of `src` (type `from`) to float32. `from` must not be kInt4Packed.
void to_f32(DType from, const void* src, float* dst, int64_t n);
// Converts n floats to `to` (bf16, f16, fp8, f32).
void from_f32(DType to, const float* src, void* dst, int64_t n);

}  // namespace strata
