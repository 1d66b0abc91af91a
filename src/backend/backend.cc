#include "backend/backend.h"

#include <cstring>
#include <vector>

#include "backend/linear_bias.h"
#include "core/check.h"

namespace strata {

namespace {
bool is_fp8(DType t) { return t == DType::kFP8E4M3 || t == DType::kFP8E5M2; }
}  // namespace

bool KvLayout::k_row_is_split(int layer) const {
  if (rope_dim <= 0 || !is_fp8(layer_dtype(layer))) return false;
  return format == KvFormat::kFlashMlaFp8 || (rope_dtype && *rope_dtype != layer_dtype(layer));
}

int64_t KvLayout::k_row_bytes(int layer) const {
  const DType dt = layer_dtype(layer);
  if (!k_row_is_split(layer)) return dtype_bytes_for(dt, k_dim);
  const int64_t latent = k_dim - rope_dim;
  CHECK_MSG(latent > 0, "rope_dim {} must be below k_dim {}", rope_dim, k_dim);
  if (format == KvFormat::kFlashMlaFp8) {
    const int64_t tiles = (latent + kFlashMlaTile - 1) / kFlashMlaTile;
    return latent + tiles * 4 + dtype_bytes_for(DType::kBF16, rope_dim);
  }
  return dtype_bytes_for(dt, latent) + dtype_bytes_for(*rope_dtype, rope_dim);
}

int64_t KvLayout::bytes_per_token() const {
  int64_t total = 0;
  for (int l = 0; l < num_layers; ++l) total += k_row_bytes(l) + v_row_bytes(l);
  return total;
}

void Backend::download(const Tensor& src, void* dst) {
  std::vector<float> f(size_t(src.numel()));
  download_f32(src, f.data());
  if (src.dtype == DType::kF32) {
    std::memcpy(dst, f.data(), f.size() * 4);
  } else {
    from_f32(src.dtype, f.data(), dst, int64_t(f.size()));
  }
}

DeviceTensorPtr upload_linear_bias(Backend& be, const Tensor& bias_f32, int64_t out) {
  if (bias_f32.empty()) return nullptr;
  CHECK_MSG(bias_f32.dtype == DType::kF32 && bias_f32.numel() == out,
            "linear bias: expected float32 [{}], got {} {}", out, dtype_name(bias_f32.dtype),
            shape_str(bias_f32.shape));
  return be.upload(bias_f32, DType::kF32);
}

LinearWeight Backend::upload_linear(const HostLinearWeight& w, const Tensor& bias_f32) {
  w.check_sizes();
  const Shape shape = w.stack == 1 ? Shape{w.out, w.in} : Shape{w.stack, w.out, w.in};
  HostTensor dense(DType::kF32, shape);
  dequantize_linear(w, dense.f32());
  LinearWeight lw;
  lw.weight = upload(dense.view, weight_dtype());
  lw.format = LinearFormat{.format = WeightFormat::kDense, .dense_dtype = weight_dtype()};
  lw.stack = w.stack;
  lw.out = w.out;
  lw.in = w.in;
  lw.bias = upload_linear_bias(*this, bias_f32, w.out);
  return lw;
}

void Backend::linear_silu_mul(const Tensor& x, const LinearWeight& w, const Tensor& out) {
  const int64_t t = x.numel() / x.dim(-1);
  auto gu = alloc(activation_dtype(), {t, w.out_features()});
  linear(x, w, *gu);
  silu_mul(*gu, out);
}

void Backend::qkv_rope_kv_write(const Tensor& qkv, int heads, int kv_heads, int head_dim,
                                const RopeArgs& rope_args, KvStorage& kv, int layer,
                                const AttentionMetadata& meta, const Tensor& q) {
  const int64_t t = qkv.dim(0), hd = head_dim, qw = heads * hd, kw = kv_heads * hd;
  auto k = alloc(qkv.dtype, {t, kv_heads, hd});
  auto v = alloc(qkv.dtype, {t, kv_heads, hd});
  slice_columns(qkv, 0, qw, q);
  slice_columns(qkv, qw, qw + kw, *k);
  slice_columns(qkv, qw + kw, qw + 2 * kw, *v);
  rope(q, meta.positions, rope_args);
  rope(*k, meta.positions, rope_args);
  kv_write(kv, layer, *k, *v, meta);
}

void Backend::rms_norm_columns(const Tensor& x, const Tensor& weight, float eps) {
  const int64_t t = x.dim(0), n = weight.numel();
  auto part = alloc(x.dtype, {t, n});
  slice_columns(x, 0, n, *part);
  rms_norm(*part, weight, eps, *part);
  copy_columns(*part, 0, n, x, 0);
}

void Backend::mla_attention_inputs(const Tensor& kv_row, const Tensor& norm, const Tensor& q,
                                   const Tensor& q_latent, const MlaInputsArgs& args, KvStorage& kv,
                                   int layer, const AttentionMetadata& meta) {
  const int64_t t = kv_row.dim(0), latent = norm.numel(), rope_dim = args.rope.rotary_dim;
  CHECK_EQ(kv_row.rank(), 2);
  CHECK_EQ(kv_row.dim(1), latent + rope_dim);
  CHECK_EQ(q.rank(), 3);
  CHECK_EQ(q.dim(0), t);
  CHECK_LE(args.q_rope_offset + rope_dim, q.dim(2));
  CHECK_EQ(q_latent.numel(), t * q.dim(1) * (latent + rope_dim));
  CHECK_EQ(t, meta.num_tokens);
  rms_norm_columns(kv_row, norm, args.eps);
  RopeArgs k_rope = args.rope;
  k_rope.offset = int(latent);
  rope(kv_row.reshape({t, 1, latent + rope_dim}), meta.positions, k_rope);
  RopeArgs q_rope = args.rope;
  q_rope.offset = args.q_rope_offset;
  rope(q, meta.positions, q_rope);
  copy_columns(q, args.q_rope_offset, args.q_rope_offset + rope_dim, q_latent, latent);
  kv_write(kv, layer, kv_row, Tensor{}, meta);
}

void Backend::moe_experts_add(const Tensor& x, const MoeExpertWeights& experts,
                              const Tensor& topk_ids, const Tensor& topk_weights,
                              const Tensor& add_in, const Tensor& out) {
  auto routed = alloc(out.dtype, out.shape);
  moe_experts(x, experts, topk_ids, topk_weights, *routed);
  add(add_in, *routed, out);  // out may alias add_in (add allows out == a)
}

}  // namespace strata
