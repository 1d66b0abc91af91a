// The CUDA backend's one dispatch: checks each Backend call's tensors, fills the launch
// parameters and records the launch (cuda_backend.h). Kernels live one op per .cu file.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>

#include "backend/cuda/attention_prefill_split.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/fp8.cuh"

namespace strata::cuda {
namespace {

// Op ids: part of a graph step's signature.
enum Op : int {
  kOpCopy = 1,
  kOpCopyRows,
  kOpRmsNorm,
  kOpAdd,
  kOpSiluMul,
  kOpRope,
  kOpGemv,
  kOpGemm,
  kOpBias,
  kOpKvWrite,
  kOpDecode,
  kOpPrefill,
  kOpGemmBatched,
  kOpSlice,
  kOpSample,
  kOpGemvGlu,
  kOpQkvRope,
  kOpGemvMma,
  kOpGemvMmaGlu,
};

}  // namespace

namespace {
int g_decode_blocks_per_sm = 4;  // split-KV target: this many decode blocks per SM
}  // namespace

void set_decode_blocks_per_sm(int n) { g_decode_blocks_per_sm = std::max(1, n); }

const char* op_name(int op) {
  static const char* names[] = {"?",      "h2d_copy", "copy_rows", "rms_norm", "add",
                                "silu_mul", "rope",   "gemv",      "gemm",     "bias",
                                "kv_write", "attn_decode", "attn_prefill", "gemm_batched",
                                "slice", "sample", "gemv_silu", "qkv_rope_kv", "gemv_mma",
                                "gemv_mma_silu"};
  return op >= 0 && op < int(sizeof names / sizeof names[0]) ? names[op] : "?";
}

namespace {

template <typename P>
P zeroed() {
  P p;
  std::memset(static_cast<void*>(&p), 0, sizeof p);
  return p;
}

void check_bf16(const Tensor& t, const char* what) {
  CHECK_MSG(t.dtype == DType::kBF16, "{}: expected a bf16 tensor, got {}", what, dtype_name(t.dtype));
  CHECK_MSG(t.device == Device::kCuda || t.data == nullptr, "{}: tensor is not on the GPU", what);
}

// A decode GEMV: out [m, n] = x [m, k] · w [n, k]ᵀ (+ bias [n]), with the current launch tunables
// (part of a graph step's signature).
GemvParams gemv_params(const Tensor& x, const Tensor& w, const float* bias, const Tensor& out, int64_t m,
                       bool pdl_early) {
  auto p = zeroed<GemvParams>();
  p.x = x.ptr<bf16_bits>();
  p.w = w.ptr<bf16_bits>();
  p.bias = bias;
  p.out = out.ptr<bf16_bits>();
  p.m = int(m);
  p.n = w.dim(0);
  p.k = w.dim(1);
  p.prefetch_elems = gemv_prefetch_elems();
  p.block_warps = gemv_block_warps();
  p.pdl_early = pdl_early;
  p.mma_warps_per_sm = gemv_mma_warps_per_sm();
  return p;
}

struct GemmParams {
  cublasHandle_t handle;
  const void* x;  // [m, k] (row stride ldx)
  const void* w;  // [n, k] (row stride ldw)
  void* out;      // [m, n] (row stride ldo)
  int m, n, k;
  int ldx, ldw, ldo;
  int batch;  // strided-batched when > 1
  int64_t stride_x, stride_w, stride_o;
};

void run_gemm(const GemmParams& p, cudaStream_t stream) {
  CHECK(cublasSetStream(p.handle, stream) == CUBLAS_STATUS_SUCCESS);
  const float alpha = 1.0f, beta = 0.0f;
  // Row-major out = x · wᵀ is column-major outᵀ [n, m] = (w as k×n column-major)ᵀ · (x as k×m).
  cublasStatus_t st;
  if (p.batch <= 1) {
    st = cublasGemmEx(p.handle, CUBLAS_OP_T, CUBLAS_OP_N, p.n, p.m, p.k, &alpha, p.w, CUDA_R_16BF,
                      p.ldw, p.x, CUDA_R_16BF, p.ldx, &beta, p.out, CUDA_R_16BF, p.ldo,
                      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  } else {
    st = cublasGemmStridedBatchedEx(p.handle, CUBLAS_OP_T, CUBLAS_OP_N, p.n, p.m, p.k, &alpha, p.w,
                                    CUDA_R_16BF, p.ldw, p.stride_w, p.x, CUDA_R_16BF, p.ldx,
                                    p.stride_x, &beta, p.out, CUDA_R_16BF, p.ldo, p.stride_o,
                                    p.batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  }
  CHECK_MSG(st == CUBLAS_STATUS_SUCCESS, "cuBLAS GEMM failed: status {} (m {} n {} k {})", int(st),
            p.m, p.n, p.k);
}

}  // namespace

void CudaBackend::embedding(const int32_t* ids, int num_tokens, const Tensor& table,
                            const Tensor& out) {
  const int64_t vocab = table.dim(0), h = table.dim(1);
  CHECK_EQ(out.dim(0), num_tokens);
  CHECK(out.dtype == table.dtype);
  for (int t = 0; t < num_tokens; ++t)
    CHECK_MSG(ids[t] >= 0 && ids[t] < vocab, "token id {} outside vocab {}", ids[t], vocab);
  if (num_tokens == 0) return;
  const int32_t* dev_ids = stage_i32(ids, num_tokens);
  auto p = zeroed<CopyRowsParams>();
  p.x = table.data;
  p.out = out.data;
  p.rows = dev_ids;
  p.n = num_tokens;
  p.x_stride = p.out_stride = p.width = h;
  p.elem_bytes = dtype_size(table.dtype);
  record(kOpCopyRows, p, launch_copy_rows);
}

void CudaBackend::gather_rows(const Tensor& x, const int32_t* rows, int n, const Tensor& out) {
  CHECK_EQ(out.dim(0), n);
  CHECK(out.dtype == x.dtype);
  const int64_t h = x.dim(-1);
  for (int i = 0; i < n; ++i) CHECK_LT(rows[i], x.dim(0));
  if (n == 0) return;
  const int32_t* dev_rows = stage_i32(rows, n);
  auto p = zeroed<CopyRowsParams>();
  p.x = x.data;
  p.out = out.data;
  p.rows = dev_rows;
  p.n = n;
  p.x_stride = p.out_stride = p.width = h;
  p.elem_bytes = dtype_size(x.dtype);
  record(kOpCopyRows, p, launch_copy_rows);
}

void CudaBackend::slice_columns(const Tensor& x, int64_t begin, int64_t end, const Tensor& out) {
  const int64_t rows = x.dim(0), cols = x.numel() / rows, w = end - begin;
  CHECK(0 <= begin && begin <= end && end <= cols);
  CHECK_EQ(out.numel(), rows * w);
  CHECK(out.dtype == x.dtype);
  begin_op();
  const int eb = dtype_size(x.dtype);
  if (graph_mode_) {
    // Consecutive slices of one tensor (Q, K, V of a fused projection) share one launch.
    MultiSliceParams m = last_slice_;
    const bool merge = last_op_ == kOpSlice && !pending_.empty() && m.x == x.data && m.n == rows &&
                       m.x_stride == cols && m.elem_bytes == eb && m.count < kMaxSlices;
    if (merge) {
      drop_last();
    } else {
      m = zeroed<MultiSliceParams>();
      m.x = x.data;
      m.n = rows;
      m.x_stride = cols;
      m.elem_bytes = eb;
    }
    m.out[m.count] = out.data;
    m.x_begin[m.count] = begin;
    m.width[m.count] = w;
    ++m.count;
    record(kOpSlice, m, launch_multi_slice);
    last_slice_ = m;
    return;
  }
  auto p = zeroed<CopyRowsParams>();
  p.x = x.data;
  p.out = out.data;
  p.n = rows;
  p.x_stride = cols;
  p.out_stride = w;
  p.x_begin = begin;
  p.width = w;
  p.elem_bytes = eb;
  record(kOpCopyRows, p, launch_copy_rows);
}

void CudaBackend::copy_columns(const Tensor& x, int64_t begin, int64_t end, const Tensor& out,
                               int64_t out_begin) {
  const int64_t cx = x.dim(-1), co = out.dim(-1), rows = x.numel() / cx, w = end - begin;
  CHECK(0 <= begin && begin <= end && end <= cx);
  CHECK(0 <= out_begin && out_begin + w <= co);
  CHECK_EQ(out.numel() / co, rows);
  CHECK(out.dtype == x.dtype);
  begin_op();
  auto p = zeroed<CopyRowsParams>();
  p.x = x.data;
  p.out = out.data;
  p.n = rows;
  p.x_stride = cx;
  p.out_stride = co;
  p.x_begin = begin;
  p.out_begin = out_begin;
  p.width = w;
  p.elem_bytes = dtype_size(x.dtype);
  record(kOpCopyRows, p, launch_copy_rows);
}

void CudaBackend::linear(const Tensor& x, const LinearWeight& w, const Tensor& out) {
  const Tensor& wt = w.weight->view();
  const int64_t m = x.numel() / x.dim(-1), k = x.dim(-1), n = wt.dim(0);
  CHECK_MSG(wt.dim(1) == k, "linear: x has {} features, weight {}", k, shape_str(wt.shape));
  CHECK_EQ(out.numel(), m * n);
  if (out.dtype == DType::kF32) return linear_f32_out(x, w, out);  // routers (fallback.cc)
  check_bf16(x, "linear x");
  check_bf16(wt, "linear weight");
  check_bf16(out, "linear out");
  const float* bias = nullptr;
  if (w.bias) {
    CHECK_MSG(w.bias->view().dtype == DType::kF32, "linear: bias must be f32");
    bias = w.bias->view().ptr<float>();
  }
  if (m == 0) return;
  begin_op();
  const bool vec_ok = k % 8 == 0 && uintptr_t(x.data) % 16 == 0 && uintptr_t(wt.data) % 16 == 0;
  if (vec_ok && use_gemv_mma(m)) {  // tensor-core GEMV (linear_mma.cu)
    record(kOpGemvMma, gemv_params(x, wt, bias, out, m, pdl_early_), launch_gemv_mma);
    return;
  }
  const bool gemv_ok = m <= gemv_max_rows() && vec_ok;
  if (gemv_ok) {
    record(kOpGemv, gemv_params(x, wt, bias, out, m, pdl_early_), launch_gemv);
    return;
  }
  auto g = zeroed<GemmParams>();
  g.handle = cublas_;
  g.x = x.data;
  g.w = wt.data;
  g.out = out.data;
  g.m = int(m);
  g.n = int(n);
  g.k = int(k);
  g.ldx = g.ldw = int(k);
  g.ldo = int(n);
  g.batch = 1;
  record(kOpGemm, g, run_gemm);
  if (bias) {
    auto b = zeroed<BiasAddParams>();
    b.out = out.ptr<bf16_bits>();
    b.bias = bias;
    b.rows = m;
    b.cols = n;
    record(kOpBias, b, launch_bias_add);
  }
}

void CudaBackend::linear_silu_mul(const Tensor& x, const LinearWeight& w, const Tensor& out) {
  const Tensor& wt = w.weight->view();
  const int64_t m = x.numel() / x.dim(-1), k = x.dim(-1), n = wt.dim(0), inter = n / 2;
  CHECK_MSG(wt.dim(1) == k, "linear_silu_mul: x has {} features, weight {}", k, shape_str(wt.shape));
  CHECK_MSG(n % 2 == 0, "linear_silu_mul: weight {} has an odd row count", shape_str(wt.shape));
  CHECK_EQ(out.numel(), m * inter);
  const bool mma = use_gemv_mma(m);
  const bool gemv_ok = fusion_ && m > 0 && (m <= gemv_max_rows() || mma) && k % 8 == 0 &&
                       x.dtype == DType::kBF16 && wt.dtype == DType::kBF16 &&
                       out.dtype == DType::kBF16 && uintptr_t(x.data) % 16 == 0 &&
                       uintptr_t(wt.data) % 16 == 0 &&
                       (!w.bias || w.bias->view().dtype == DType::kF32);
  if (!gemv_ok) return Backend::linear_silu_mul(x, w, out);
  begin_op();
  GemvParams p = gemv_params(x, wt, w.bias ? w.bias->view().ptr<float>() : nullptr, out, m, pdl_early_);
  p.glu_inter = inter;
  if (mma) record(kOpGemvMmaGlu, p, launch_gemv_mma);
  else record(kOpGemvGlu, p, launch_gemv);
}

void CudaBackend::per_head_linear(const Tensor& x, int64_t x_begin, const Tensor& w,
                                  const Tensor& out, int64_t out_begin) {
  CHECK_EQ(x.rank(), 3);
  CHECK_EQ(out.rank(), 3);
  CHECK_EQ(w.rank(), 3);
  const int64_t tokens = x.dim(0), heads = x.dim(1), dx = x.dim(2), dout = out.dim(2);
  const int64_t n = w.dim(1), k = w.dim(2);
  CHECK_EQ(w.dim(0), heads);
  CHECK_EQ(out.dim(0), tokens);
  CHECK_EQ(out.dim(1), heads);
  CHECK(x_begin + k <= dx && out_begin + n <= dout);
  check_bf16(x, "per_head_linear x");
  check_bf16(w, "per_head_linear w");
  check_bf16(out, "per_head_linear out");
  if (tokens == 0) return;
  begin_op();
  auto g = zeroed<GemmParams>();
  g.handle = cublas_;
  g.x = x.ptr<bf16_bits>() + x_begin;
  g.w = w.data;
  g.out = out.ptr<bf16_bits>() + out_begin;
  g.m = int(tokens);
  g.n = int(n);
  g.k = int(k);
  g.ldx = int(heads * dx);
  g.ldw = int(k);
  g.ldo = int(heads * dout);
  g.batch = int(heads);
  g.stride_x = dx;
  g.stride_w = n * k;
  g.stride_o = dout;
  record(kOpGemmBatched, g, run_gemm);
}

void CudaBackend::rms_norm(const Tensor& x, const Tensor& weight, float eps, const Tensor& out) {
  const int64_t d = weight.numel(), rows = x.numel() / d;
  CHECK_EQ(out.numel(), x.numel());
  check_bf16(x, "rms_norm x");
  check_bf16(out, "rms_norm out");
  begin_op();
  auto p = zeroed<RmsNormParams>();
  p.x = x.ptr<bf16_bits>();
  p.weight = weight.data;
  p.weight_f32 = weight.dtype == DType::kF32;
  p.out = out.ptr<bf16_bits>();
  p.rows = rows;
  p.dim = int(d);
  p.eps = eps;
  p.pdl_early = pdl_early_;
  record(kOpRmsNorm, p, launch_rms_norm);
}

void CudaBackend::add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& weight,
                               float eps, const Tensor& out) {
  const int64_t d = weight.numel(), rows = x.numel() / d;
  CHECK_EQ(residual.numel(), x.numel());
  CHECK_EQ(out.numel(), x.numel());
  check_bf16(x, "add_rms_norm x");
  check_bf16(residual, "add_rms_norm residual");
  check_bf16(out, "add_rms_norm out");
  begin_op();
  auto p = zeroed<RmsNormParams>();
  p.x = x.ptr<bf16_bits>();
  p.residual = residual.ptr<bf16_bits>();
  p.weight = weight.data;
  p.weight_f32 = weight.dtype == DType::kF32;
  p.out = out.ptr<bf16_bits>();
  p.rows = rows;
  p.dim = int(d);
  p.eps = eps;
  p.pdl_early = pdl_early_;
  record(kOpRmsNorm, p, launch_rms_norm);
}

void CudaBackend::add(const Tensor& a, const Tensor& b, const Tensor& out) {
  CHECK_EQ(a.numel(), b.numel());
  CHECK_EQ(out.numel(), a.numel());
  check_bf16(a, "add a");
  check_bf16(b, "add b");
  check_bf16(out, "add out");
  begin_op();
  auto p = zeroed<AddParams>();
  p.a = a.ptr<bf16_bits>();
  p.b = b.ptr<bf16_bits>();
  p.out = out.ptr<bf16_bits>();
  p.n = a.numel();
  record(kOpAdd, p, launch_add);
}

void CudaBackend::silu_mul(const Tensor& x, const Tensor& out) {
  const int64_t rows = x.dim(0), inter = out.dim(1);
  CHECK_EQ(x.dim(1), 2 * inter);
  check_bf16(x, "silu_mul x");
  check_bf16(out, "silu_mul out");
  begin_op();
  auto p = zeroed<SiluMulParams>();
  p.x = x.ptr<bf16_bits>();
  p.out = out.ptr<bf16_bits>();
  p.rows = rows;
  p.inter = inter;
  record(kOpSiluMul, p, launch_silu_mul);
}

void CudaBackend::rope(const Tensor& x, const int32_t* positions, const RopeArgs& args) {
  CHECK_EQ(x.rank(), 3);
  check_bf16(x, "rope x");
  const int half = args.rotary_dim / 2;
  CHECK_LE(args.offset + args.rotary_dim, x.dim(2));
  CHECK_MSG(half <= kMaxRopeHalf, "rope: rotary_dim {} too large", args.rotary_dim);
  if (x.dim(0) == 0 || half == 0) return;
  auto p = zeroed<RopeParams>();
  p.positions = stage_i32(positions, x.dim(0));
  p.x = x.ptr<bf16_bits>();
  p.tokens = x.dim(0);
  p.heads = int(x.dim(1));
  p.stride = int(x.dim(2));
  p.offset = args.offset;
  p.half = half;
  p.interleaved = args.interleaved;
  p.attention_factor = args.attention_factor;
  for (int i = 0; i < half; ++i) p.inv_freq[i] = args.inv_freq[i];
  if (graph_mode_ && last_op_ == kOpRope && !pending_.empty()) {
    // rope(q) then rope(k) with the same positions and frequencies: one launch.
    RopeParams m = last_rope_;
    if (m.x2 == nullptr && m.positions == p.positions && m.tokens == p.tokens && m.half == p.half &&
        m.offset == p.offset && m.interleaved == p.interleaved &&
        m.attention_factor == p.attention_factor &&
        std::memcmp(m.inv_freq, p.inv_freq, sizeof p.inv_freq) == 0) {
      drop_last();
      m.x2 = p.x;
      m.heads2 = p.heads;
      m.stride2 = p.stride;
      record(kOpRope, m, launch_rope);
      last_rope_ = m;
      return;
    }
  }
  record(kOpRope, p, launch_rope);
  last_rope_ = p;
}

// The kernels' element code of a KV cache tensor (CudaKvStorage holds bf16 and fp8 layers only).
static int kv_elem_of(const Tensor& cache) {
  switch (cache.dtype) {
    case DType::kBF16: return kKvBf16;
    case DType::kFP8E4M3: return kKvE4M3;
    case DType::kFP8E5M2: return kKvE5M2;
    default: CHECK_MSG(false, "CUDA KV cache of dtype {}", dtype_name(cache.dtype));
  }
  return kKvBf16;
}

void CudaBackend::kv_write(KvStorage& kv, int layer, const Tensor& k, const Tensor& v,
                           const AttentionMetadata& meta) {
  const KvLayout& lay = kv.layout();
  CHECK_EQ(k.numel(), int64_t(meta.num_tokens) * lay.k_dim);
  for (int t = 0; t < meta.num_tokens; ++t) {
    const int64_t slot = meta.slot_mapping[t];
    CHECK_MSG(slot >= 0 && slot < lay.num_pages * lay.page_size, "slot {} out of pool", slot);
  }
  if (meta.num_tokens == 0) return;
  const DeviceMeta& dm = device_meta(meta);
  check_bf16(k, "kv_write k");
  auto p = zeroed<KvWriteParams>();
  p.src_k = k.ptr<bf16_bits>();
  p.cache_k = kv.k(layer).data;
  p.kv_elem = kv_elem_of(kv.k(layer));
  p.slots = dm.slot_mapping;
  p.tokens = meta.num_tokens;
  p.k_dim = lay.k_dim;
  // 1 / scale in float, as the CPU reference computes it (backend/kv_format.cc).
  p.inv_scale_k = 1.0f / kv.k_scale(layer);
  p.inv_scale_v = 1.0f;
  if (lay.v_dim > 0) {
    check_bf16(v, "kv_write v");
    CHECK_EQ(v.numel(), int64_t(meta.num_tokens) * lay.v_dim);
    p.src_v = v.ptr<bf16_bits>();
    p.cache_v = kv.v(layer).data;
    p.v_dim = lay.v_dim;
    p.inv_scale_v = 1.0f / kv.v_scale(layer);
  }
  record(kOpKvWrite, p, launch_kv_write);
}

void CudaBackend::qkv_rope_kv_write(const Tensor& qkv, int heads, int kv_heads, int head_dim,
                                    const RopeArgs& ra, KvStorage& kv, int layer,
                                    const AttentionMetadata& meta, const Tensor& q) {
  const KvLayout& lay = kv.layout();
  const int64_t t = qkv.dim(0), hd = head_dim;
  CHECK_EQ(qkv.numel(), t * (heads + 2 * kv_heads) * hd);
  CHECK_EQ(q.numel(), t * heads * hd);
  CHECK_EQ(t, meta.num_tokens);
  const int half = ra.rotary_dim / 2;
  const Tensor kc = kv.k(layer);
  const bool fused = fusion_ && qkv.dtype == DType::kBF16 && q.dtype == DType::kBF16 &&
                     hd % 2 == 0 && ra.offset == 0 && ra.rotary_dim % 2 == 0 &&
                     ra.rotary_dim <= hd && half <= kMaxRopeHalf &&
                     lay.k_dim == kv_heads * hd && lay.v_dim == kv_heads * hd &&
                     !lay.k_row_is_split(layer) && kc.dtype == kv.v(layer).dtype;
  if (!fused) {
    return Backend::qkv_rope_kv_write(qkv, heads, kv_heads, head_dim, ra, kv, layer, meta, q);
  }
  for (int i = 0; i < meta.num_tokens; ++i) {
    const int64_t slot = meta.slot_mapping[i];
    CHECK_MSG(slot >= 0 && slot < lay.num_pages * lay.page_size, "slot {} out of pool", slot);
  }
  if (t == 0) return;
  begin_op();
  const DeviceMeta& dm = device_meta(meta);
  auto p = zeroed<QkvRopeParams>();
  p.qkv = qkv.ptr<bf16_bits>();
  p.q = q.ptr<bf16_bits>();
  p.cache_k = kc.data;
  p.cache_v = kv.v(layer).data;
  p.positions = dm.positions;
  p.slots = dm.slot_mapping;
  p.tokens = t;
  p.heads = heads;
  p.kv_heads = kv_heads;
  p.head_dim = int(hd);
  p.half = half;
  p.interleaved = ra.interleaved;
  p.kv_elem = kv_elem_of(kc);
  p.pdl_early = pdl_early_;
  p.attention_factor = ra.attention_factor;
  // 1 / scale in float, as kv_write (and the CPU reference) computes it.
  p.inv_scale_k = 1.0f / kv.k_scale(layer);
  p.inv_scale_v = 1.0f / kv.v_scale(layer);
  for (int i = 0; i < half; ++i) p.inv_freq[i] = ra.inv_freq[i];
  record(kOpQkvRope, p, launch_qkv_rope_kv_write);
}

void CudaBackend::paged_attention(const Tensor& q, const KvStorage& kv, int layer,
                                  const AttentionMetadata& meta, const AttentionArgs& args,
                                  const Tensor& out) {
  const KvLayout& lay = kv.layout();
  const int heads = args.num_heads, kv_heads = args.num_kv_heads, hd = args.head_dim;
  CHECK_EQ(lay.k_dim, kv_heads * hd);
  CHECK_EQ(lay.v_dim, kv_heads * args.v_head_dim);
  CHECK_MSG(args.v_head_dim == hd, "CUDA paged attention: v_head_dim {} != head_dim {}",
            args.v_head_dim, hd);
  CHECK_EQ(heads % kv_heads, 0);
  check_bf16(q, "attention q");
  check_bf16(out, "attention out");
  if (meta.num_tokens == 0) return;
  const DeviceMeta& dm = device_meta(meta);
  auto p = zeroed<AttentionParams>();
  p.q = q.ptr<bf16_bits>();
  p.k_cache = kv.k(layer).data;
  p.v_cache = kv.v(layer).data;
  p.kv_elem = kv_elem_of(kv.k(layer));
  p.out = out.ptr<bf16_bits>();
  p.meta = dm;
  p.heads = heads;
  p.kv_heads = kv_heads;
  p.head_dim = hd;
  p.scale_log2 = args.scale * 1.4426950408889634f;
  p.k_scale = kv.k_scale(layer);
  p.v_scale = kv.v_scale(layer);
  p.kv_scale = p.k_scale * p.v_scale;
  p.pdl_early = pdl_early_;
  const int group = heads / kv_heads;

  if (meta_min_q_ == 1 && meta_max_q_ == 1 && decode_attention_supported(hd, group)) {
    // Split-KV sized from a power-of-two bucket of the longest context, so the grid (and a
    // captured graph) stays the same while contexts grow inside the bucket.
    const int tpi = decode_tokens_per_iteration(hd);
    int64_t bucket = 256;
    while (bucket < meta_max_kv_) bucket *= 2;
    const int64_t blocks_per_split = int64_t(meta.num_seqs) * kv_heads;
    const int64_t target = int64_t(g_decode_blocks_per_sm) * num_sms_;
    int64_t splits = std::max<int64_t>(1, (target + blocks_per_split - 1) / blocks_per_split);
    // At least 64 tokens per split: shorter splits cost more in merging than they gain.
    splits = std::min<int64_t>(splits, std::max<int64_t>(1, bucket / std::max(64, tpi)));
    int64_t split_len = (bucket + splits - 1) / splits;
    split_len = (split_len + tpi - 1) / tpi * tpi;
    splits = (bucket + split_len - 1) / split_len;
    p.num_splits = int(splits);
    p.split_len = int(split_len);
    DeviceTensorPtr work;
    if (splits > 1) {
      const int64_t parts = int64_t(meta.num_seqs) * heads * splits;
      work = scratch(parts * (hd + 2) * 4);
      p.partial_o = static_cast<float*>(work->view().data);
      p.partial_ml = p.partial_o + parts * hd;
    }
    record(kOpDecode, p, launch_decode_attention);
    return;
  }
  // Short query chunks over long contexts: split-KV (attention_prefill_split.h); the regular
  // kernels below take the batch's other sequences.
  SplitPrefillPlan plan;
  if (plan_split_prefill(meta, hd, group, kv_heads, p.kv_elem != kKvBf16, num_sms_, &plan)) {
    auto sp = zeroed<SplitPrefillParams>();
    std::memcpy(static_cast<void*>(&sp.a), &p, sizeof p);
    sp.a.split_len = plan.split_len;
    sp.a.num_tiles = int(plan.work.size() / 4);
    sp.a.tiles = stage_i32(plan.work.data(), int64_t(plan.work.size()));
    sp.num_combine = int(plan.combine.size() / 4);
    DeviceTensorPtr work;
    if (sp.num_combine > 0) {
      sp.combine = stage_i32(plan.combine.data(), int64_t(plan.combine.size()));
      const int64_t rows = plan.partial_groups * kv_heads * kSplitPrefillRows;
      work = scratch(rows * (hd + 2) * 4);
      sp.a.partial_o = static_cast<float*>(work->view().data);
      sp.a.partial_ml = sp.a.partial_o + rows * hd;
    }
    record(kOpPrefill, sp, launch_split_prefill);
  }
  CHECK_MSG(prefill_attention_supported(hd), "CUDA paged attention: head_dim {} not supported", hd);
  std::vector<int32_t> tiles;
  const int tile_tokens = prefill_tile_tokens(hd, group);
  for (int s = 0; s < meta.num_seqs; ++s) {
    if (plan.takes(s)) continue;  // split-KV above
    const int n_new = meta.q_indptr[s + 1] - meta.q_indptr[s];
    for (int r = 0; r < n_new; r += tile_tokens) {
      tiles.push_back(s);
      tiles.push_back(r);
    }
  }
  p.num_tiles = int(tiles.size() / 2);
  if (p.num_tiles == 0) return;
  p.tiles = stage_i32(tiles.data(), int64_t(tiles.size()));
  record(kOpPrefill, p, launch_prefill_attention);
}

void CudaBackend::sample(const Tensor& logits, const SampleRowParams* params, int32_t* out_ids) {
  static_assert(sizeof(SampleRowDev) == sizeof(SampleRowParams) &&
                offsetof(SampleRowParams, uniform) == offsetof(SampleRowDev, uniform) &&
                offsetof(SampleRowParams, min_p) == offsetof(SampleRowDev, min_p));
  CHECK(logits.is_contiguous());
  CHECK_MSG(logits.dtype == DType::kBF16 || logits.dtype == DType::kF32,
            "sample: logits must be bf16 or f32, got {}", dtype_name(logits.dtype));
  const int64_t rows = logits.numel() == 0 ? 0 : logits.dim(0), vocab = logits.dim(-1);
  if (rows == 0) return;
  CHECK_MSG(vocab < (int64_t(1) << 31), "sample: vocab {} too large", vocab);
  bool any_sampling = false;
  for (int64_t r = 0; r < rows; ++r) any_sampling |= !sample_is_greedy(params[r]);
  if (logits.dtype == DType::kF32 && any_sampling) {
    // Float32 logits (not produced by this backend's models): the reference on the host.
    std::vector<float> host(size_t(rows * vocab));
    download_f32(logits, host.data());
    std::vector<std::pair<float, int32_t>> scratch;
    for (int64_t r = 0; r < rows; ++r)
      out_ids[r] = sample_row_reference(host.data() + r * vocab, vocab, params[r], scratch);
    return;
  }
  // The row parameters travel through staging as raw 32-bit words (24 bytes a row).
  const int32_t* dev_params =
      stage_i32(reinterpret_cast<const int32_t*>(params), rows * int64_t(sizeof(SampleRowParams) / 4));
  auto out = alloc(DType::kI32, {rows});
  DeviceTensorPtr hist;
  if (any_sampling) hist = scratch(rows * 65536 * 4);
  auto p = zeroed<SampleParams>();
  p.logits = logits.data;
  p.params = reinterpret_cast<const SampleRowDev*>(dev_params);
  p.out = static_cast<int32_t*>(out->view().data);
  p.hist = hist ? static_cast<uint32_t*>(hist->view().data) : nullptr;
  p.vocab = vocab;
  p.rows = int(rows);
  p.f32 = logits.dtype == DType::kF32;
  const int64_t row_bytes = vocab * dtype_size(logits.dtype);
  p.vec = row_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(logits.data) % 16 == 0;
  p.any_sampling = any_sampling;
  record(kOpSample, p, launch_sample);
  end_step();
  CUDA_CHECK(cudaMemcpy(out_ids, out->view().data, size_t(rows) * 4, cudaMemcpyDeviceToHost));
}

}  // namespace strata::cuda
