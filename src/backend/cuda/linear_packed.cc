// The linear family's packed weight formats (issue 21): upload keeps INT4 group-quantized and
// FP8 128x128-block weights packed on the device at exactly linear_device_bytes (the planner's
// figure), and linear / linear_silu_mul run them through their kernels:
//
//   INT4 (W4A16)  repacked once into the tiled device layout (linear_int4.h); m rows <=
//                 int4_use_gemv -> the decode GEMV (weights streamed once, SwiGLU fused), else
//                 the wgmma GEMM dequantizing in its main loop. Weights bit for bit the CPU twin's.
//   FP8 block     values as stored, scale rows padded to fp8_gemm_scale_ld floats; few rows ->
//                 the W8A16 GEMV (bf16 activations, SwiGLU fused), else the weight dequantized
//                 to bf16 and the bf16 GEMM (exact: DeepSeek's reference inference dequantizes
//                 the same way), or, opt-in (CudaTunables::fp8_w8a8, lossy), DeepSeek-V3's W8A8:
//                 the activations quantized per token per 128 values (act_quant), then
//                 cuBLASLt's block-scaled FP8 GEMM (linear_fp8.h). The crossover is measured.
//
// Shapes the kernels do not take (an INT4 group that is not a power of two >= 32, fp8 blocks
// other than 128x128, k % 16 != 0) are dequantized to bf16 at upload, with a warning.
// Stacked weights (a MoE layer's routed experts) the MoE kernels take are kept in their layout
// (moe_weights.h; bf16 and fp8 through upload_moe_stack in moe.cu, int4 as here).
#include <algorithm>
#include <cstring>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/linear_fp8.h"
#include "backend/cuda/linear_int4.h"
#include "backend/cuda/moe_weights.h"
#include "backend/linear_bias.h"
#include "core/log.h"

namespace strata::cuda {
namespace {

// The kernels' launchers take a stream; the recorder hands them a Launch.
void run_int4_gemm(const Int4LinearParams& p, const Launch& l) { launch_int4_gemm(p, l.stream); }
void run_fp8_gemv(const Fp8GemvParams& p, const Launch& l) { launch_fp8_gemv(p, l.stream); }
void run_fp8_linear(const Fp8LinearParams& p, const Launch& l) { launch_fp8_linear(p, l.stream); }
void run_fp8_dequant(const Fp8DequantParams& p, const Launch& l) {
  launch_fp8_dequant(p, l.stream);
}
void run_int4_dequant(const Int4DequantParams& p, const Launch& l) {
  launch_int4_dequant_bf16(p, l.stream);
}

constexpr size_t kFp8GemmWorkspaceBytes = size_t(32) << 20;  // cuBLASLt's recommendation on Hopper

// The FP8 GEMV or a GEMM for m rows of an [n, k] weight. Measured against the W8A8 GEMM on
// DeepSeek-V3's shapes (2026-12-01, H200, bench/cuda/fp8_linear_bench.cc): the GEMV wins at m <= 2
// everywhere and up to m = 16 on small weights (kv_a 576 x 7168: 15.9 us vs 18.1 at m = 16); on
// large ones the GEMM wins from m = 4 (gate/up 7168 -> 18432: 53 us vs 91). The default W8A16
// GEMM (dequantize + cuBLAS) has not been timed against the GEMV yet: the same rule serves it.
bool fp8_use_gemv(int64_t m, int64_t n, int64_t k) {
  if (m <= 2) return true;
  if (m > kFp8GemvMaxRows) return false;
  return n * k <= (int64_t(8) << 20);
}

bool int4_kernels_take(const LinearFormat& f, int64_t k) {
  return int4_group_supported(f.group_size) && k % f.group_size == 0 && k % 32 == 0;
}
bool fp8_kernels_take(const LinearFormat& f, int64_t k) {
  return f.block_out == kFp8Block && f.block_in == kFp8Block && k % 16 == 0;
}

}  // namespace

WeightPolicy CudaBackend::weight_policy() const {
  return WeightPolicy{.dense_dtype = DType::kBF16, .keep_fp8_block = true, .keep_int4 = true};
}

LinearWeight CudaBackend::upload_linear(const HostLinearWeight& w, const Tensor& bias_f32) {
  w.check_sizes();
  const LinearFormat& f = w.format;
  const bool keep = (f.format == WeightFormat::kInt4Group && int4_kernels_take(f, w.in)) ||
                    (f.format == WeightFormat::kFp8Block && fp8_kernels_take(f, w.in));
  const LinearFormat device =
      keep ? f : LinearFormat{.format = WeightFormat::kDense, .dense_dtype = DType::kBF16};
  if (w.stack > 1 && moe_stack_tiled(device, w.stack, w.out, w.in, !bias_f32.empty())) {
    init_moe_kernels();
    if (device.format != WeightFormat::kInt4Group) {
      if (!keep && f.format != WeightFormat::kDense)
        LOG_WARN(
            "CUDA backend: {} experts [{}, {}] are not a shape the packed kernels take; "
            "dequantized to bf16",
            f.str(), w.out, w.in);
      return upload_moe_stack(w, device);
    }
  }
  if (f.format == WeightFormat::kDense && f.dense_dtype == DType::kBF16)
    return upload_dense_bf16(w, bias_f32);
  if (!keep) {
    if (f.format != WeightFormat::kDense)
      LOG_WARN(
          "CUDA backend: a {} weight [{}, {}] is not a shape its kernels take; dequantized to bf16 "
          "(the planner's figure assumed it packed)",
          f.str(), w.out, w.in);
    return Backend::upload_linear(w, bias_f32);
  }
  end_step();
  LinearWeight lw;
  lw.format = f;
  lw.stack = w.stack;
  lw.out = w.out;
  lw.in = w.in;
  const int64_t n = w.out, k = w.in;
  if (f.format == WeightFormat::kInt4Group) {
    if (!int4_ready_) {
      init_int4_linear_kernels();  // before any graph capture
      int4_ready_ = true;
    }
    const int64_t packed = int4_packed_bytes(n, k), scale = int4_scale_bytes(n, k, f.group_size);
    lw.weight = alloc_resident(DType::kU8, {w.stack, packed});
    lw.scales = alloc_resident(DType::kBF16, {w.stack, scale / 2});
    // The checkpoint's bytes go up once; the repack writes the tiled layout beside them.
    auto src = scratch(int64_t(w.values.size() + w.scales.size()));
    char* sv = static_cast<char*>(src->view().data);
    upload_bytes(sv, w.values.data(), w.values.size());
    upload_bytes(sv + w.values.size(), w.scales.data(), w.scales.size());
    for (int64_t s = 0; s < w.stack; ++s) {
      Int4RepackParams p = zeroed<Int4RepackParams>();
      p.src_packed = reinterpret_cast<const int32_t*>(sv + s * w.matrix_values_bytes());
      p.src_scale =
          reinterpret_cast<const bf16_bits*>(sv + w.values.size() + s * w.matrix_scales_bytes());
      p.dst_packed = static_cast<char*>(lw.weight->view().data) + s * packed;
      p.dst_scale = lw.scales->view().ptr<bf16_bits>() + s * (scale / 2);
      p.n = n;
      p.k = k;
      p.src_cols = (k + 7) / 8;
      p.group = f.group_size;
      launch_int4_repack(p, stream_);
    }
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  } else {
    // fp8: values as stored; scale rows padded to the GEMM's stride (zeros beyond the blocks).
    if (fp8_planner_ == nullptr) {
      CUDA_CHECK(cudaMalloc(&fp8_workspace_, kFp8GemmWorkspaceBytes));
      fp8_planner_ = std::make_unique<Fp8GemmPlanner>(fp8_workspace_, kFp8GemmWorkspaceBytes);
    }
    const int64_t rows = (n + kFp8Block - 1) / kFp8Block, cols = fp8_scale_cols(k),
                  ld = fp8_gemm_scale_ld(k);
    lw.weight = alloc_resident(DType::kFP8E4M3, {w.stack, n, k});
    lw.scales = alloc_resident(DType::kF32, {w.stack, rows, ld});
    std::vector<float> padded(size_t(w.stack * rows * ld), 0.0f);
    for (int64_t s = 0; s < w.stack; ++s)
      for (int64_t r = 0; r < rows; ++r)
        std::memcpy(padded.data() + (s * rows + r) * ld,
                    w.scales.data() + ((s * rows + r) * cols) * 4, size_t(cols) * 4);
    upload_bytes(lw.weight->view().data, w.values.data(), w.values.size());
    upload_bytes(lw.scales->view().data, padded.data(), padded.size() * 4);
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  CHECK_EQ(lw.weight->view().nbytes() + lw.scales->view().nbytes(),
           w.stack * linear_device_bytes(f, n, k));
  lw.bias = upload_linear_bias(*this, bias_f32, n);
  return lw;
}

LinearWeight CudaBackend::upload_dense_bf16(const HostLinearWeight& w, const Tensor& bias_f32) {
  CHECK(w.format.format == WeightFormat::kDense && w.format.dense_dtype == DType::kBF16);
  end_step();
  // The stored bytes are the device's: what Backend::upload_linear's float32 round trip gave,
  // without it.
  LinearWeight lw;
  lw.weight =
      alloc_resident(DType::kBF16, w.stack == 1 ? Shape{w.out, w.in} : Shape{w.stack, w.out, w.in});
  upload_bytes(lw.weight->view().data, w.values.data(), w.values.size());
  lw.format = w.format;
  lw.stack = w.stack;
  lw.out = w.out;
  lw.in = w.in;
  lw.bias = upload_linear_bias(*this, bias_f32, w.out);
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  return lw;
}

void CudaBackend::linear_packed(const Tensor& x, const LinearWeight& w, const Tensor& out,
                                bool glu) {
  const int64_t m = x.numel() / x.dim(-1), k = x.dim(-1), n = w.out_features();
  CHECK_MSG(w.stack == 1, "linear: a stack of {} matrices is not one linear", w.stack);
  CHECK_MSG(k == w.in_features(), "linear: x has {} features, the {} weight {}", k, w.format.str(),
            w.in_features());
  CHECK_EQ(out.numel(), m * (glu ? n / 2 : n));
  check_bf16(x, "linear x");
  check_bf16(out, "linear out");
  const float* bias = w.bias ? w.bias->view().ptr<float>() : nullptr;
  if (m == 0) return;
  begin_op();
  if (tunables_.deterministic) {
    // Batch-invariant: the weight dequantized to bf16 into scratch (the same bits at every m),
    // then the fixed-tile GEMM (linear_det.h). glu never comes here (linear_silu_mul takes the
    // Backend default in this mode).
    CHECK(!glu);
    auto dense = scratch(n * k * 2);
    if (w.format.format == WeightFormat::kInt4Group) {
      auto dq = zeroed<Int4DequantParams>();
      dq.packed = w.weight->view().data;
      dq.scale = w.scales->view().ptr<bf16_bits>();
      dq.out = static_cast<bf16_bits*>(dense->view().data);
      dq.n = n;
      dq.k = k;
      dq.group = w.format.group_size;
      record(kOpInt4Dequant, dq, run_int4_dequant);
    } else {
      CHECK(w.format.format == WeightFormat::kFp8Block);
      auto dq = zeroed<Fp8DequantParams>();
      dq.w.w = static_cast<const uint8_t*>(w.weight->view().data);
      dq.w.scale = w.scales->view().ptr<float>();
      dq.w.n = n;
      dq.w.k = k;
      dq.w.scale_ld = fp8_gemm_scale_ld(k);
      dq.out = static_cast<bf16_bits*>(dense->view().data);
      record(kOpFp8Dequant, dq, run_fp8_dequant);
    }
    return record_det_gemm(x.data, dense->view().data, bias, out.data, false, m, n, k);
  }
  if (w.format.format == WeightFormat::kInt4Group) {
    auto p = zeroed<Int4LinearParams>();
    p.x = x.ptr<bf16_bits>();
    p.packed = w.weight->view().data;
    p.scale = w.scales->view().ptr<bf16_bits>();
    p.bias = bias;
    p.out = out.ptr<bf16_bits>();
    p.m = m;
    p.n = n;
    p.k = k;
    p.group = w.format.group_size;
    p.pdl_early = tunables_.pdl_early;
    p.preload = 1;  // weights are never written by the kernel before (linear_int4.h)
    if (int4_use_gemv(m, n, k)) {
      p.gemv_depth = tunables_.int4_gemv_depth;
      p.gemv_grid = tunables_.int4_gemv_blocks_per_sm * num_sms_;
      p.gemv_unroll = tunables_.int4_gemv_ring;
      p.gemv_rows = tunables_.int4_gemv_rows;
      p.gemv_x_tma = tunables_.int4_gemv_x_tma;
      if (glu) p.glu_inter = n / 2;
      if (merge_int4_gemv_norm(&p)) {  // graph mode: the rms_norm that made x as a prologue
        recorder_.drop_last();
        return record(kOpInt4GemvNorm, p, run_int4_gemv);
      }
      return record(glu ? kOpInt4GemvGlu : kOpInt4Gemv, p, run_int4_gemv);
    }
    CHECK(!glu);
    return record(kOpInt4Gemm, p, run_int4_gemm);
  }
  CHECK(w.format.format == WeightFormat::kFp8Block);
  Fp8Weight fw{};
  fw.w = static_cast<const uint8_t*>(w.weight->view().data);
  fw.scale = w.scales->view().ptr<float>();
  fw.n = n;
  fw.k = k;
  fw.scale_ld = fp8_gemm_scale_ld(k);
  if (fp8_use_gemv(m, n, k) || glu) {
    auto p = zeroed<Fp8GemvParams>();
    p.x = x.ptr<bf16_bits>();
    p.w = fw;
    p.bias = bias;
    p.out = out.ptr<bf16_bits>();
    p.glu_inter = glu ? n / 2 : 0;
    p.m = int(m);
    p.batches = 1;
    p.pdl_early = tunables_.pdl_early;
    return record(glu ? kOpFp8GemvGlu : kOpFp8Gemv, p, run_fp8_gemv);
  }
  if (!tunables_.fp8_w8a8) {
    // W8A16 (the default): the weight dequantized to bf16 into scratch (the reference's bits),
    // then the bf16 GEMM. The dequantization reads n·k bytes once per linear: a few percent of a
    // prefill's GEMM time.
    auto dense = scratch(n * k * 2);
    Fp8DequantParams dq{};
    dq.w = fw;
    dq.out = static_cast<bf16_bits*>(dense->view().data);
    record(kOpFp8Dequant, dq, run_fp8_dequant);
    return record_gemm(x.data, dense->view().data, bias, out.data, m, n, k);
  }
  const int64_t gm = fp8_gemm_rows(m);
  std::string why;
  Fp8GemmPlan* plan = fp8_planner_->try_plan(gm, n, k, &why);
  if (plan == nullptr) {
    // A shape cuBLASLt's block-scaled GEMM refuses: the GEMV, kFp8GemvMaxRows rows at a time.
    for (int64_t r = 0; r < m; r += kFp8GemvMaxRows) {
      auto p = zeroed<Fp8GemvParams>();
      p.x = x.ptr<bf16_bits>() + r * k;
      p.w = fw;
      p.bias = bias;
      p.out = out.ptr<bf16_bits>() + r * n;
      p.m = int(std::min<int64_t>(kFp8GemvMaxRows, m - r));
      p.batches = 1;
      p.pdl_early = tunables_.pdl_early;
      record(kOpFp8Gemv, p, run_fp8_gemv);
    }
    return;
  }
  // Scratch for the quantized activations and their scales (returned to the pool at once: stream
  // order keeps the GEMM's reads ahead of any reuse).
  auto xq = scratch(m * k), xs = scratch(fp8_scale_cols(k) * m * 4);
  auto p = zeroed<Fp8LinearParams>();
  p.plan = plan;
  p.x = x.ptr<bf16_bits>();
  p.w = fw;
  p.bias = bias;
  p.out = out.ptr<bf16_bits>();
  p.xq = static_cast<uint8_t*>(xq->view().data);
  p.x_scale = xs->view().ptr<float>();
  p.m = m;
  record(kOpFp8Linear, p, run_fp8_linear);
}

DeviceTensorPtr CudaBackend::dequantize_bf16(const LinearWeight& w) {
  const int64_t n = w.out_features(), k = w.in_features();
  auto out = alloc(DType::kBF16, {w.stack, n, k});
  // Stacked experts in the MoE tiles (moe_weights.h): bf16 and fp8 values back to row-major.
  const bool tiled = moe_stack_tiled(w) && w.format.format != WeightFormat::kInt4Group;
  DeviceTensorPtr untiled;
  if (tiled) {
    MoeRepackParams p{};
    p.src = w.weight->view().data;
    p.rows = w.stack * n;
    p.k = k;
    p.unpack = 1;
    if (w.is_dense()) {
      p.dst = out->view().data;
      p.format = kMoeBf16;
      launch_moe_repack(p, stream_);
      return out;
    }
    untiled = alloc(DType::kU8, {w.stack * n * k});
    p.dst = untiled->view().data;
    p.format = kMoeFp8;
    launch_moe_repack(p, stream_);
  }
  if (w.is_dense()) {
    CUDA_CHECK(cudaMemcpyAsync(out->view().data, w.weight->view().data,
                               size_t(out->view().nbytes()), cudaMemcpyDeviceToDevice, stream_));
    return out;
  }
  for (int64_t s = 0; s < w.stack; ++s) {
    bf16_bits* dst = out->view().ptr<bf16_bits>() + s * n * k;
    if (w.format.format == WeightFormat::kInt4Group) {
      const int64_t packed = int4_packed_bytes(n, k),
                    scale = int4_scale_bytes(n, k, w.format.group_size);
      auto p = zeroed<Int4DequantParams>();
      p.packed = static_cast<const char*>(w.weight->view().data) + s * packed;
      p.scale = w.scales->view().ptr<bf16_bits>() + s * (scale / 2);
      p.out = dst;
      p.n = n;
      p.k = k;
      p.group = w.format.group_size;
      launch_int4_dequant_bf16(p, stream_);
    } else {
      // Tiled: the expert's dense table at the start of its slot (moe_weights.h).
      const int64_t rows = (n + kFp8Block - 1) / kFp8Block, ld = fp8_gemm_scale_ld(k);
      Fp8DequantParams p{};
      p.w.w = static_cast<const uint8_t*>(tiled ? untiled->view().data : w.weight->view().data) +
              s * n * k;
      p.w.scale = w.scales->view().ptr<float>() + s * rows * ld;
      p.w.n = n;
      p.w.k = k;
      p.w.scale_ld = tiled ? fp8_scale_cols(k) : ld;
      p.out = dst;
      launch_fp8_dequant(p, stream_);
    }
  }
  return out;
}

// linear_silu_mul on a packed weight: the GEMVs fuse the SwiGLU epilogue; at the GEMM's sizes the
// Backend default (linear, then silu_mul).
bool CudaBackend::packed_glu_fused(const Tensor& x, const LinearWeight& w) const {
  const int64_t m = x.numel() / x.dim(-1), n = w.out_features();
  if (!tunables_.fusion || m == 0 || n % 2 != 0) return false;
  if (w.format.format == WeightFormat::kInt4Group)
    return int4_use_gemv(m, n, x.dim(-1)) && (n / 2) % 16 == 0;
  return m <= kFp8GemvMaxRows && fp8_use_gemv(m, n, x.dim(-1));
}

}  // namespace strata::cuda
