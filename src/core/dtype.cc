#include "core/dtype.h"

#include <cmath>
#include <limits>

#include "core/check.h"

namespace strata {
namespace {

// A small binary float format: 1 sign bit, `ebits` exponent bits, `mbits` mantissa bits.
struct MiniFloat {
  int ebits;
  int mbits;
  int bias;
  bool ieee_special;  // all-ones exponent = inf/NaN (f16, e5m2); else only S.1111.111 is NaN
                      // (e4m3fn)
  bool saturate;      // overflow -> max finite (fp8) instead of inf (f16)
};

constexpr MiniFloat kF16{5, 10, 15, true, false};
constexpr MiniFloat kE4M3{4, 3, 7, false, true};
constexpr MiniFloat kE5M2{5, 2, 15, true, true};

double max_finite(const MiniFloat& m) {
  int max_exp_field = (1 << m.ebits) - 1;
  int max_mant = (1 << m.mbits) - 1;
  if (m.ieee_special) {
    max_exp_field -= 1;
  } else {
    max_mant -= 1;  // S.1111.111 is NaN
  }
  return std::ldexp(1.0 + double(max_mant) / (1 << m.mbits), max_exp_field - m.bias);
}

double decode(const MiniFloat& m, uint32_t code) {
  const uint32_t nbits = 1 + m.ebits + m.mbits;
  const bool neg = (code >> (nbits - 1)) & 1;
  const uint32_t e = (code >> m.mbits) & ((1u << m.ebits) - 1);
  const uint32_t mant = code & ((1u << m.mbits) - 1);
  const uint32_t e_all = (1u << m.ebits) - 1;
  double v;
  if (m.ieee_special && e == e_all) {
    v = mant == 0 ? std::numeric_limits<double>::infinity()
                  : std::numeric_limits<double>::quiet_NaN();
  } else if (!m.ieee_special && e == e_all && mant == ((1u << m.mbits) - 1)) {
    v = std::numeric_limits<double>::quiet_NaN();
  } else if (e == 0) {
    v = std::ldexp(double(mant), 1 - m.bias - m.mbits);
  } else {
    v = std::ldexp(1.0 + double(mant) / (1 << m.mbits), int(e) - m.bias);
  }
  return neg ? -v : v;
}

uint32_t encode(const MiniFloat& m, float f) {
  const uint32_t nbits = 1 + m.ebits + m.mbits;
  const uint32_t sign = std::signbit(f) ? (1u << (nbits - 1)) : 0u;
  const uint32_t e_all = (1u << m.ebits) - 1;
  if (std::isnan(f)) {
    // Canonical quiet NaN: all-ones exponent and mantissa.
    return sign | (e_all << m.mbits) | ((1u << m.mbits) - 1);
  }
  const double maxv = max_finite(m);
  double a = std::fabs(double(f));
  if (std::isinf(a)) {
    if (m.saturate)
      a = maxv;
    else
      return sign | (e_all << m.mbits);
  }
  if (a == 0.0) return sign;
  // Quantum of the binade that holds `a` (subnormals share the smallest normal binade's).
  int exp2;
  std::frexp(a, &exp2);  // a = frac * 2^exp2, frac in [0.5, 1)
  int unbiased = exp2 - 1;
  const int min_normal = 1 - m.bias;
  if (unbiased < min_normal) unbiased = min_normal;
  const double quantum = std::ldexp(1.0, unbiased - m.mbits);
  // a / quantum is exact in double; nearbyint rounds half to even in the default mode.
  const double q = std::nearbyint(a / quantum);
  double v = q * quantum;
  if (v > maxv) {
    if (m.saturate)
      v = maxv;
    else
      return sign | (e_all << m.mbits);  // IEEE overflow -> inf
  }
  if (v == 0.0) return sign;
  // Encode the representable value v.
  std::frexp(v, &exp2);
  int e = exp2 - 1;
  uint32_t e_field, mant;
  if (e < min_normal) {
    e_field = 0;
    mant = uint32_t(std::ldexp(v, m.bias - 1 + m.mbits));
  } else {
    e_field = uint32_t(e + m.bias);
    mant = uint32_t(std::ldexp(v, -e) * (1 << m.mbits)) - (1u << m.mbits);
  }
  return sign | (e_field << m.mbits) | mant;
}

// Decode tables for the 8-bit formats; built once.
struct Fp8Tables {
  float e4m3[256];
  float e5m2[256];
  Fp8Tables() {
    for (int i = 0; i < 256; ++i) {
      e4m3[i] = float(decode(kE4M3, uint32_t(i)));
      e5m2[i] = float(decode(kE5M2, uint32_t(i)));
    }
  }
};
const Fp8Tables& fp8_tables() {
  static const Fp8Tables t;
  return t;
}

}  // namespace

int dtype_size(DType t) {
  switch (t) {
    case DType::kF32:
      return 4;
    case DType::kBF16:
      return 2;
    case DType::kF16:
      return 2;
    case DType::kFP8E4M3:
      return 1;
    case DType::kFP8E5M2:
      return 1;
    case DType::kI8:
      return 1;
    case DType::kU8:
      return 1;
    case DType::kI32:
      return 4;
    case DType::kI64:
      return 8;
    case DType::kInt4Packed:
      return 1;
  }
  return 0;
}

int64_t dtype_bytes_for(DType t, int64_t n) {
  if (t == DType::kInt4Packed) return (n + 1) / 2;
  return n * dtype_size(t);
}

float f16_to_f32(uint16_t h) { return float(decode(kF16, h)); }
uint16_t f32_to_f16(float f) { return uint16_t(encode(kF16, f)); }
float fp8_e4m3_to_f32(uint8_t v) { return fp8_tables().e4m3[v]; }
float fp8_e5m2_to_f32(uint8_t v) { return fp8_tables().e5m2[v]; }
uint8_t f32_to_fp8_e4m3(float f) { return uint8_t(encode(kE4M3, f)); }
uint8_t f32_to_fp8_e5m2(float f) { return uint8_t(encode(kE5M2, f)); }

void to_f32(DType from, const void* src, float* dst, int64_t n) {
  switch (from) {
    case DType::kF32:
      std::memcpy(dst, src, size_t(n) * 4);
      return;
    case DType::kBF16: {
      auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
      return;
    }
    case DType::kF16: {
      auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
      return;
    }
    case DType::kFP8E4M3: {
      auto* s = static_cast<const uint8_t*>(src);
      const float* t = fp8_tables().e4m3;
      for (int64_t i = 0; i < n; ++i) dst[i] = t[s[i]];
      return;
    }
    case DType::kFP8E5M2: {
      auto* s = static_cast<const uint8_t*>(src);
      const float* t = fp8_tables().e5m2;
      for (int64_t i = 0; i < n; ++i) dst[i] = t[s[i]];
      return;
    }
    case DType::kI8: {
      auto* s = static_cast<const int8_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = float(s[i]);
      return;
    }
    case DType::kU8: {
      auto* s = static_cast<const uint8_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = float(s[i]);
      return;
    }
    case DType::kI32: {
      auto* s = static_cast<const int32_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = float(s[i]);
      return;
    }
    case DType::kI64: {
      auto* s = static_cast<const int64_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = float(s[i]);
      return;
    }
    case DType::kInt4Packed:
      break;
  }
  CHECK_MSG(false, "to_f32: unsupported dtype {}", dtype_name(from));
}

void from_f32(DType to, const float* src, void* dst, int64_t n) {
  switch (to) {
    case DType::kF32:
      std::memcpy(dst, src, size_t(n) * 4);
      return;
    case DType::kBF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i]);
      return;
    }
    case DType::kF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_f16(src[i]);
      return;
    }
    case DType::kFP8E4M3: {
      auto* d = static_cast<uint8_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_fp8_e4m3(src[i]);
      return;
    }
    case DType::kFP8E5M2: {
      auto* d = static_cast<uint8_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_fp8_e5m2(src[i]);
      return;
    }
    default:
      break;
  }
  CHECK_MSG(false, "from_f32: unsupported dtype {}", dtype_name(to));
}

}  // namespace strata
