#include "backend/kv_format.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/check.h"

namespace strata {

void encode_plain_row(DType dtype, const float* src, int64_t n, float scale, void* dst) {
  if (scale == 1.0f) {
    from_f32(dtype, src, dst, n);
    return;
  }
  float tmp[256];
  const float inv = 1.0f / scale;
  for (int64_t b = 0; b < n; b += 256) {
    const int64_t m = std::min<int64_t>(256, n - b);
    for (int64_t i = 0; i < m; ++i) tmp[i] = src[b + i] * inv;
    from_f32(dtype, tmp, static_cast<char*>(dst) + dtype_bytes_for(dtype, b), m);
  }
}

void decode_plain_row(DType dtype, const void* src, int64_t n, float scale, float* dst) {
  to_f32(dtype, src, dst, n);
  if (scale != 1.0f)
    for (int64_t i = 0; i < n; ++i) dst[i] *= scale;
}

namespace {

// FlashMLA: tile t of the latent is stored as e4m3 of value / s_t with s_t = amax_t / 448
// (1 for an all-zero tile), the scales as float32 after the latent bytes.
void encode_flashmla(const KvLayout& lay, const float* src, char* dst) {
  const int64_t latent = lay.k_dim - lay.rope_dim;
  const int64_t tiles = (latent + kFlashMlaTile - 1) / kFlashMlaTile;
  char* scales = dst + latent;
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t b = t * kFlashMlaTile, n = std::min<int64_t>(kFlashMlaTile, latent - b);
    float amax = 0;
    for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(src[b + i]));
    const float s = amax > 0 ? amax / kFp8E4M3Max : 1.0f;
    std::memcpy(scales + t * 4, &s, 4);
    encode_plain_row(DType::kFP8E4M3, src + b, n, s, dst + b);
  }
  from_f32(DType::kBF16, src + latent, scales + tiles * 4, lay.rope_dim);
}

void decode_flashmla(const KvLayout& lay, const char* src, float* dst) {
  const int64_t latent = lay.k_dim - lay.rope_dim;
  const int64_t tiles = (latent + kFlashMlaTile - 1) / kFlashMlaTile;
  const char* scales = src + latent;
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t b = t * kFlashMlaTile, n = std::min<int64_t>(kFlashMlaTile, latent - b);
    float s;
    std::memcpy(&s, scales + t * 4, 4);
    decode_plain_row(DType::kFP8E4M3, src + b, n, s, dst + b);
  }
  to_f32(DType::kBF16, scales + tiles * 4, dst + latent, lay.rope_dim);
}

// bf16 rope parts stay unscaled: bf16 has the range, and a calibrated fp8 scale means nothing to
// it.
float rope_scale(DType rope_dtype, float scale) {
  return rope_dtype == DType::kFP8E4M3 || rope_dtype == DType::kFP8E5M2 ? scale : 1.0f;
}

}  // namespace

void encode_k_row(const KvLayout& lay, int layer, const float* src, float scale, void* dst) {
  const DType dt = lay.layer_dtype(layer);
  if (!lay.k_row_is_split(layer)) return encode_plain_row(dt, src, lay.k_dim, scale, dst);
  char* out = static_cast<char*>(dst);
  if (lay.format == KvFormat::kFlashMlaFp8) return encode_flashmla(lay, src, out);
  const int64_t latent = lay.k_dim - lay.rope_dim;
  encode_plain_row(dt, src, latent, scale, out);
  encode_plain_row(*lay.rope_dtype, src + latent, lay.rope_dim, rope_scale(*lay.rope_dtype, scale),
                   out + dtype_bytes_for(dt, latent));
}

void decode_k_row(const KvLayout& lay, int layer, const void* src, float scale, float* dst) {
  const DType dt = lay.layer_dtype(layer);
  if (!lay.k_row_is_split(layer)) return decode_plain_row(dt, src, lay.k_dim, scale, dst);
  const char* in = static_cast<const char*>(src);
  if (lay.format == KvFormat::kFlashMlaFp8) return decode_flashmla(lay, in, dst);
  const int64_t latent = lay.k_dim - lay.rope_dim;
  decode_plain_row(dt, in, latent, scale, dst);
  decode_plain_row(*lay.rope_dtype, in + dtype_bytes_for(dt, latent), lay.rope_dim,
                   rope_scale(*lay.rope_dtype, scale), dst + latent);
}

}  // namespace strata
