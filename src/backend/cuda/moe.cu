// Mixture-of-experts through the CUDA backend (issue 23): the host entries of the router's
// float32 linear, moe_route and moe_experts, and the upload of stacked expert weights in the MoE
// kernels' layout (moe_weights.h). The kernels: moe_route.h (router GEMV, expert choice) and
// moe_experts.h (grouped expert GEMMs, combine).
//
//   linear_f32_out  logits f32 [T, E] = x · gateᵀ (+ bias): T <= kMoeRouterMaxTokens (decode)
//                   launch_moe_router, its split-k partials in per-op scratch and its tile
//                   counters owned by the backend (zeroed once; every launch leaves them zero,
//                   so graph replays need no reset); above, cublasGemmEx bf16 x bf16 -> f32
//                   (compute 32F). A bias is one more float32 launch.
//   moe_route       launch_moe_route (one warp per token).
//   moe_experts     launch_moe_experts, recorded as one launch: the 3 (decode) to 6 (prefill)
//                   kernels it issues are a function of its parameter block, which is what a
//                   graph's signature holds. Scratch (moe_experts_scratch_bytes) comes from the
//                   pool per call: the same step shape gets the same addresses (LIFO), so
//                   captured graphs stay valid. Regime by host-known sizes (kMoeAuto).
//                   moe_experts_add passes the shared experts' output to the combine (`add`).
// None of them synchronizes or allocates outside the pool, so MoE steps are graph-capturable.
// Shapes the kernels refuse (more experts than kMoeRouteMaxExperts / kMoeMaxExperts, top-k
// above 32, experts kept row-major, a packed router weight) run on the CPU twin (cpu_twin.cc),
// counted, the first refusal logged with its reason.
#include <algorithm>
#include <cstring>
#include <vector>

#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/linear_fp8.h"
#include "backend/cuda/linear_int4.h"
#include "backend/cuda/moe_route.h"
#include "backend/cuda/moe_weights.h"
#include "backend/cuda/norm.h"
#include "core/thread_pool.h"

namespace strata::cuda {
namespace {

// cuBLAS with a float32 output: the router above kMoeRouterMaxTokens rows. Row-major
// out [m, n] = x [m, k] · w [n, k]ᵀ is column-major outᵀ = wᵀ·x, as linear.cu's run_gemm.
struct RouterGemmParams {
  cublasHandle_t handle;
  const void* x;
  const void* w;
  float* out;
  int m, n, k, pad_;
};
void run_router_gemm(const RouterGemmParams& p, const Launch& launch) {
  CHECK(cublasSetStream(p.handle, launch.stream) == CUBLAS_STATUS_SUCCESS);
  const float alpha = 1.0f, beta = 0.0f;
  const cublasStatus_t st = cublasGemmEx(p.handle, CUBLAS_OP_T, CUBLAS_OP_N, p.n, p.m, p.k, &alpha,
                                         p.w, CUDA_R_16BF, p.k, p.x, CUDA_R_16BF, p.k, &beta, p.out,
                                         CUDA_R_32F, p.n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  CHECK_MSG(st == CUBLAS_STATUS_SUCCESS, "cuBLAS router GEMM failed: status {} (m {} n {} k {})",
            int(st), p.m, p.n, p.k);
}

// out[r, j] += bias[j], float32 (the CPU reference adds the bias to the float32 product).
struct BiasF32Params {
  float* out;
  const float* bias;
  int64_t rows;
  int64_t cols;
};
__global__ void bias_f32_kernel(BiasF32Params p) {
  const int64_t n = p.rows * p.cols;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    p.out[i] += p.bias[i % p.cols];
}
void run_bias_f32(const BiasF32Params& p, const Launch& launch) {
  const int64_t n = p.rows * p.cols;
  if (n == 0) return;
  bias_f32_kernel<<<unsigned(std::min<int64_t>(ceil_div(n, 256), 4096)), 256, 0, launch.stream>>>(
      p);
  CUDA_LAUNCH_CHECK();
}

void run_moe_router(const MoeRouterParams& p, const Launch& l) { launch_moe_router(p, l.stream); }
void run_moe_route(const MoeRouteParams& p, const Launch& l) { launch_moe_route(p, l.stream); }
void run_moe_experts(const MoeExpertsParams& p, const Launch& l) {
  launch_moe_experts(p, l.stream);
}

bool aligned16(const void* p) { return uintptr_t(p) % 16 == 0; }

// The MoE kernels' format of a LinearFormat the CUDA backend keeps, or -1.
int moe_format_of(const LinearFormat& f) {
  switch (f.format) {
    case WeightFormat::kDense:
      return f.dense_dtype == DType::kBF16 ? kMoeBf16 : -1;
    case WeightFormat::kFp8Block:
      return f.block_out == kMoeFp8Block && f.block_in == kMoeFp8Block ? kMoeFp8 : -1;
    case WeightFormat::kInt4Group:
      return kMoeInt4;
  }
  return -1;
}

// Experts per upload chunk: about 256 MB of values on the device at once.
int64_t upload_chunk(int64_t stack, int64_t matrix_bytes) {
  return std::clamp<int64_t>((int64_t(256) << 20) / std::max<int64_t>(matrix_bytes, 1), 1, stack);
}

// Why launch_moe_experts cannot take this call (null: it can).
const char* moe_experts_refusal(const Tensor& x, const MoeExpertWeights& experts,
                                const Tensor& topk_ids, const Tensor& out) {
  const char* why = nullptr;
  if (!moe_stack_tiled(experts.gate_up, &why) || !moe_stack_tiled(experts.down, &why)) return why;
  const int64_t k = topk_ids.dim(-1);
  if (k < 1 || k > kMoeMaxTopK) return "top-k above 32";
  if (experts.gate_up.format.format == WeightFormat::kFp8Block &&
      experts.inter() % kMoeFp8Block != 0)
    return "fp8 experts with an intermediate size that is not a multiple of 128";
  if (!aligned16(x.data) || !aligned16(out.data) || !aligned16(topk_ids.data))
    return "tensors not 16-byte aligned";
  return nullptr;
}

}  // namespace

// ---- the layout of stacked experts (moe_weights.h) ----
bool moe_stack_tiled(const LinearFormat& f, int64_t stack, int64_t n, int64_t k, bool has_bias,
                     const char** why) {
  const char* w = nullptr;
  const int format = moe_format_of(f);
  if (stack < 2 || stack > kMoeMaxExperts)
    w = "the MoE kernels take 2 to 1024 experts";
  else if (has_bias)
    w = "expert weights with a bias";
  else if (format < 0)
    w = "a weight format the MoE kernels do not read";
  else if (format == kMoeFp8 && k % 32 != 0)
    w = "fp8 experts need k % 32 == 0 (the tiles' bytes equal the planner's n · k)";
  else
    moe_weight_shape_ok(format, n, k, format == kMoeInt4 ? f.group_size : 0, &w);
  if (why) *why = w;
  return w == nullptr;
}

int64_t moe_fp8_scale_slot(int64_t n, int64_t k) {
  return ceil_div(n, kMoeFp8Block) * fp8_gemm_scale_ld(k);
}

MoeWeights moe_weights_of(const LinearWeight& w) {
  CHECK(moe_stack_tiled(w));
  MoeWeights v{};
  v.n = w.out_features();
  v.k = w.in_features();
  v.format = moe_format_of(w.format);
  v.values = w.weight->view().data;
  v.scales = w.scales ? w.scales->view().data : nullptr;
  if (v.format == kMoeInt4) {
    v.group = w.format.group_size;
    v.values_stride = int4_packed_bytes(v.n, v.k);
    v.scales_stride = int4_scale_bytes(v.n, v.k, v.group);
  } else {
    v.values_stride = moe_values_bytes(v.format, v.n, v.k);
    v.scales_stride = v.format == kMoeFp8 ? moe_fp8_scale_slot(v.n, v.k) * 4 : 0;
  }
  return v;
}

void CudaBackend::init_moe_kernels() {
  if (moe_ready_) return;
  init_moe_gemm_kernels();  // the GEMM's shared-memory limit, set before any graph capture
  moe_ready_ = true;
}

LinearWeight CudaBackend::upload_moe_stack(const HostLinearWeight& w, const LinearFormat& device) {
  CHECK(moe_stack_tiled(device, w.stack, w.out, w.in, false));
  init_moe_kernels();
  end_step();
  const int64_t stack = w.stack, n = w.out, k = w.in;
  LinearWeight lw;
  lw.format = device;
  lw.stack = stack;
  lw.out = n;
  lw.in = k;
  auto repack = [&](const void* src, void* dst, int64_t rows, int format) {
    MoeRepackParams p{};
    p.src = src;
    p.dst = dst;
    p.rows = rows;
    p.k = k;
    p.format = format;
    launch_moe_repack(p, stream_);
  };
  if (device.format == WeightFormat::kDense) {
    // Any dense dtype, or a packed format the kernels do not take, as bf16, uploaded and tiled a
    // chunk of experts at a time. bf16 as stored goes up as it is; other dtypes through float32
    // (the reference's dequantization on the host; a dense stack converted chunk by chunk: no
    // float32 copy of the whole stack).
    const bool dense_stored = w.format.format == WeightFormat::kDense;
    const bool bf16_stored = dense_stored && w.format.dense_dtype == DType::kBF16;
    HostTensor all;
    if (!dense_stored) {
      all = HostTensor(DType::kF32, {stack * n, k});
      dequantize_linear(w, all.f32());
    }
    lw.weight = alloc_resident(DType::kBF16, {stack, n, k});
    const int64_t chunk = upload_chunk(stack, n * k * 2), esize = dtype_size(w.format.dense_dtype);
    auto src = bf16_stored ? scratch(chunk * n * k * 2) : nullptr;
    std::vector<float> buf;
    for (int64_t s = 0; s < stack; s += chunk) {
      const int64_t c = std::min(chunk, stack - s);
      DeviceTensorPtr converted;
      const void* rows = nullptr;
      if (bf16_stored) {
        // Stream order keeps this copy behind the last chunk's repack, which reads `src`.
        upload_bytes(src->view().data, w.values.data() + s * n * k * 2, size_t(c * n * k * 2));
        rows = src->view().data;
      } else {
        float* host = dense_stored ? nullptr : all.f32() + s * n * k;
        if (dense_stored) {
          buf.resize(size_t(c * n * k));
          host = buf.data();
          const uint8_t* v = w.values.data() + s * n * k * esize;
          parallel_for(c * n * k, int64_t(1) << 16, [&](int64_t b, int64_t e) {
            to_f32(w.format.dense_dtype, v + b * esize, host + b, e - b);
          });
        }
        converted = upload(Tensor::make(host, DType::kF32, {c * n, k}), DType::kBF16);
        rows = converted->view().data;
      }
      repack(rows, lw.weight->view().ptr<bf16_bits>() + s * n * k, c * n, kMoeBf16);
    }
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  } else {
    CHECK(device.format == WeightFormat::kFp8Block && device == w.format);
    lw.weight = alloc_resident(DType::kFP8E4M3, {stack, n, k});
    const int64_t chunk = upload_chunk(stack, n * k);
    auto src = scratch(chunk * n * k);
    for (int64_t s = 0; s < stack; s += chunk) {
      const int64_t c = std::min(chunk, stack - s);
      // Stream order keeps this copy behind the last chunk's repack, which reads `src`.
      upload_bytes(src->view().data, w.values.data() + s * n * k, size_t(c * n * k));
      repack(src->view().data, static_cast<uint8_t*>(lw.weight->view().data) + s * n * k, c * n,
             kMoeFp8);
    }
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    // Each expert's dense table at the start of its slot.
    const int64_t table = ceil_div(n, kMoeFp8Block) * fp8_scale_cols(k),
                  slot = moe_fp8_scale_slot(n, k);
    CHECK_EQ(w.matrix_scales_bytes(), table * 4);
    std::vector<float> slots(size_t(stack * slot), 0.0f);
    for (int64_t s = 0; s < stack; ++s)
      std::memcpy(slots.data() + s * slot, w.scales.data() + s * table * 4, size_t(table) * 4);
    lw.scales = alloc_resident(DType::kF32, {stack, slot});
    upload_bytes(lw.scales->view().data, slots.data(), slots.size() * 4);
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  const int64_t held = lw.weight->view().nbytes() + (lw.scales ? lw.scales->view().nbytes() : 0);
  CHECK_EQ(held, stack * linear_device_bytes(device, n, k));
  return lw;
}

// ---- host entries ----
void CudaBackend::linear_f32_out(const Tensor& x, const LinearWeight& w, const Tensor& out) {
  const int64_t m = x.numel() / x.dim(-1), k = x.dim(-1), n = w.out_features();
  CHECK_MSG(k == w.in_features(), "linear: x has {} features, the weight {}", k, w.in_features());
  CHECK_EQ(out.numel(), m * n);
  CHECK(out.dtype == DType::kF32 && out.is_contiguous() && x.is_contiguous());
  check_bf16(x, "linear x");
  if (!w.is_dense() || w.stack != 1 || w.weight->view().dtype != DType::kBF16)
    return linear_f32_out_twin(x, w, out, "a float32-output linear of a packed or stacked weight");
  const Tensor& wt = w.weight->view();
  if (m == 0) return;
  if (tunables_.deterministic) {  // the batch-invariant GEMM at every m, the bias in its epilogue
    begin_op();
    const float* bias = nullptr;
    if (w.bias) {
      CHECK_MSG(w.bias->view().dtype == DType::kF32, "linear: bias must be f32");
      bias = w.bias->view().ptr<float>();
    }
    record_det_gemm(x.data, wt.data, bias, out.data, true, m, n, k);
    return;
  }
  const bool gemv =
      m <= kMoeRouterMaxTokens && k % 32 == 0 && aligned16(x.data) && aligned16(wt.data);
  const int64_t counters = moe_router_counter_bytes(n) / 4;
  if (gemv && (!moe_router_counters_ || moe_router_counters_->view().numel() < counters)) {
    // Zeroed once; every launch leaves them zero. Made between steps (the first router of a
    // backend ends the current step once): a pool block may still be the scratch of a launch
    // recorded earlier in the step, which would write it after the zeroing.
    end_step();
    moe_router_counters_ = alloc(DType::kI32, {std::max<int64_t>(counters, 64)});
    CUDA_CHECK(cudaMemsetAsync(moe_router_counters_->view().data, 0,
                               size_t(moe_router_counters_->view().nbytes()),
                               stream_));  // ahead of the router launches in stream order
  }
  begin_op();
  if (gemv) {
    const size_t partial_bytes = moe_router_partials_bytes(m, n, k);
    auto partials = partial_bytes > 0 ? scratch(int64_t(partial_bytes)) : nullptr;
    auto p = zeroed<MoeRouterParams>();
    p.x = x.ptr<bf16_bits>();
    p.w = wt.ptr<bf16_bits>();
    p.out = out.ptr<float>();
    p.partials = partials ? partials->view().ptr<float>() : nullptr;
    p.counters = moe_router_counters_->view().ptr<int32_t>();
    p.tokens = m;
    p.experts = n;
    p.hidden = k;
    p.pdl_early = tunables_.pdl_early;
    p.preload = tunables_.moe_router_preload ? 1 : 0;
    record(kOpMoeRouter, p, run_moe_router);
  } else {
    auto g = zeroed<RouterGemmParams>();
    g.handle = cublas_handle();
    g.x = x.data;
    g.w = wt.data;
    g.out = out.ptr<float>();
    g.m = int(m);
    g.n = int(n);
    g.k = int(k);
    record(kOpGemmF32, g, run_router_gemm);
  }
  if (w.bias) {
    CHECK_MSG(w.bias->view().dtype == DType::kF32, "linear: bias must be f32");
    auto b = zeroed<BiasF32Params>();
    b.out = out.ptr<float>();
    b.bias = w.bias->view().ptr<float>();
    b.rows = m;
    b.cols = n;
    record(kOpBiasF32, b, run_bias_f32);
  }
}

void CudaBackend::moe_route(const Tensor& router_logits, const Tensor& correction_bias,
                            const MoeRouteArgs& args, const Tensor& topk_ids,
                            const Tensor& topk_weights) {
  const int64_t tokens = router_logits.dim(0);
  const int e = args.num_experts, k = args.top_k;
  CHECK(router_logits.dtype == DType::kF32 && router_logits.rank() == 2 &&
        router_logits.is_contiguous());
  CHECK_EQ(router_logits.dim(1), e);
  CHECK(k > 0 && k <= e);
  CHECK(args.num_groups > 0 && e % args.num_groups == 0);
  CHECK(args.topk_groups > 0 && args.topk_groups <= args.num_groups);
  CHECK(topk_ids.dtype == DType::kI32 && topk_weights.dtype == DType::kF32);
  CHECK_EQ(topk_ids.numel(), tokens * k);
  CHECK_EQ(topk_weights.numel(), tokens * k);
  if (!correction_bias.empty())
    CHECK(correction_bias.dtype == DType::kF32 && correction_bias.numel() == e);
  if (e > kMoeRouteMaxExperts || k > 32 || args.num_groups > kMoeRouteMaxGroups)
    return moe_route_twin(router_logits, correction_bias, args, topk_ids, topk_weights,
                          "more than 1024 experts, top-k above 32 or more than 32 groups");
  if (tokens == 0) return;
  begin_op();
  auto p = zeroed<MoeRouteParams>();
  p.logits = router_logits.ptr<float>();
  p.bias = correction_bias.empty() ? nullptr : correction_bias.ptr<float>();
  p.topk_ids = topk_ids.ptr<int32_t>();
  p.topk_weights = topk_weights.ptr<float>();
  p.tokens = tokens;
  p.num_experts = e;
  p.top_k = k;
  p.num_groups = args.num_groups;
  p.topk_groups = args.topk_groups;
  p.scoring = args.scoring == MoeScoring::kSigmoid ? kMoeSigmoid : kMoeSoftmax;
  p.group_score = args.group_score == MoeGroupScore::kTop2Sum ? kMoeGroupTop2Sum : kMoeGroupMax;
  p.normalize = args.normalize ? 1 : 0;
  p.scaling_factor = args.scaling_factor;
  p.pdl_early = tunables_.pdl_early;
  record(kOpMoeRoute, p, run_moe_route);
}

void CudaBackend::moe_experts(const Tensor& x, const MoeExpertWeights& experts,
                              const Tensor& topk_ids, const Tensor& topk_weights,
                              const Tensor& out) {
  moe_experts_add(x, experts, topk_ids, topk_weights, Tensor{}, out);
}

// `add` empty: plain moe_experts.
void CudaBackend::moe_experts_add(const Tensor& x, const MoeExpertWeights& experts,
                                  const Tensor& topk_ids, const Tensor& topk_weights,
                                  const Tensor& add, const Tensor& out) {
  const int64_t tokens = x.dim(0), hidden = experts.hidden(), inter = experts.inter();
  const int64_t e = experts.num_experts(), k = topk_ids.dim(-1);
  check_bf16(x, "moe_experts x");
  check_bf16(out, "moe_experts out");
  CHECK(x.rank() == 2 && x.dim(1) == hidden && x.is_contiguous() && out.is_contiguous());
  CHECK_EQ(out.numel(), tokens * hidden);
  CHECK(topk_ids.dtype == DType::kI32 && topk_weights.dtype == DType::kF32);
  CHECK(topk_ids.numel() == tokens * k && topk_weights.numel() == tokens * k);
  CHECK_EQ(experts.down.stack, e);
  CHECK(experts.gate_up.out_features() == 2 * inter && experts.gate_up.in_features() == hidden);
  if (!add.empty()) {
    check_bf16(add, "moe_experts add");
    CHECK(add.numel() == tokens * hidden && add.is_contiguous());
  }
  if (const char* why = moe_experts_refusal(x, experts, topk_ids, out)) {
    join_side_branch();
    if (!add.empty()) return Backend::moe_experts_add(x, experts, topk_ids, topk_weights, add, out);
    return moe_experts_twin(x, experts, topk_ids, topk_weights, out, why);
  }
  if (!add.empty() && !aligned16(add.data)) {
    join_side_branch();
    return Backend::moe_experts_add(x, experts, topk_ids, topk_weights, add, out);
  }
  if (tokens == 0) return join_side_branch();
  begin_op();
  auto scratch_mem =
      scratch(int64_t(moe_experts_scratch_bytes(tokens, int(k), int(e), hidden, inter)));
  auto p = zeroed<MoeExpertsParams>();
  p.x = x.ptr<bf16_bits>();
  p.topk_ids = topk_ids.ptr<int32_t>();
  p.topk_weights = topk_weights.ptr<float>();
  p.add = add.empty() ? nullptr : add.ptr<bf16_bits>();  // the combine adds it before rounding
  p.out = out.ptr<bf16_bits>();
  p.scratch = scratch_mem->view().data;
  p.gate_up = moe_weights_of(experts.gate_up);
  p.down = moe_weights_of(experts.down);
  p.tokens = tokens;
  p.top_k = int(k);
  p.num_experts = int(e);
  p.regime = kMoeAuto;
  if (tunables_.deterministic) {
    // Batch-invariant: the GEMM regime at every T with one tile shape (the GEMV and the GEMM
    // reduce in different orders; a row's sums in the GEMM depend on k alone). The combine sums a
    // token's experts in ascending expert id in both regimes.
    p.regime = kMoePrefill;
    p.fixed_tiles = 1;
  }
  p.pdl_early = tunables_.pdl_early;
  p.int4_reg_max_assignments = tunables_.moe_int4_reg_max_assignments;
  p.int4_reg_planned = tunables_.moe_int4_reg_planned ? 1 : 0;
  p.int4_reg_round = tunables_.moe_int4_reg_round ? 1 : 0;
  p.int4_gate_up_round = tunables_.moe_int4_gate_up_round ? 1 : 0;
  p.int4_split_round = tunables_.moe_int4_split_round;
  p.int4_reg_split = tunables_.moe_int4_reg_split;
  p.int4_reg_rows = tunables_.moe_int4_reg_rows;
  p.int4_reg_tile_rows = tunables_.moe_int4_reg_tile_rows;
  p.int4_reg_down_units = tunables_.moe_int4_reg_down_units;
  p.int4_reg_gate_up_warps = tunables_.moe_int4_reg_gate_up_warps;
  p.int4_reg_down_warps = tunables_.moe_int4_reg_down_warps;
  p.int4_reg_flat_down = tunables_.moe_int4_reg_flat_down ? 1 : 0;
  p.int4_split_gate_up = tunables_.moe_int4_split_gate_up ? 1 : 0;
  p.int4_split_cluster = tunables_.moe_int4_split_cluster;
  p.int4_split_warps = tunables_.moe_int4_split_warps;
  p.int4_split_ring = tunables_.moe_int4_split_ring;
  p.int4_split_tma = tunables_.moe_int4_split_tma;
  p.int4_flat_ctas_per_sm = tunables_.moe_int4_flat_ctas_per_sm;
  p.fp8_f16 = tunables_.moe_fp8_f16 ? 1 : 0;
  p.fp8_f16_smem_max_tokens = tunables_.moe_fp8_f16_smem_max_tokens;
  p.gemm_weight_stationary = tunables_.moe_gemm_weight_stationary ? 1 : 0;
  p.gemm_pipe = tunables_.moe_gemm_pipe ? 1 : 0;
  p.gemm_narrow_tails = tunables_.moe_gemm_narrow_tails ? 1 : 0;
  p.combine_cluster_max_tokens = tunables_.moe_combine_cluster_max_tokens;
  p.int4_down_combine = tunables_.moe_int4_down_combine ? 1 : 0;
  // An ended side branch (the shared experts that made `add`) joins right before the combine:
  // the routed experts' launches still overlap it.
  p.join_event = take_side_join();
  record(kOpMoeExperts, p, run_moe_experts);
}

// Graph mode, moe_combine_norm_fusion: when the launch just recorded is the MoE experts step that
// wrote np's x, its combine runs the add_rms_norm too (moe_combine.cu): one launch a MoE layer
// fewer where nothing stands between the two (tp 1; under tensor parallelism the all-reduce
// does). Also: the residual add in place (residual given, out elsewhere), rows and dim of the
// step, the one-pass vec kernel's shape, and the norm's outputs apart from what the combine reads.
bool CudaBackend::merge_moe_combine_norm(const RmsNormParams& np) {
  if (!tunables_.fusion || !tunables_.moe_combine_norm_fusion) return false;
  MoeExpertsParams e;
  if (!recorder_.last(kOpMoeExperts, &e)) return false;
  const int64_t hidden = e.down.n, bytes = e.tokens * hidden * 2;
  if (np.x != e.out || np.residual == nullptr || e.norm_out != nullptr || np.rows != e.tokens ||
      np.dim != hidden || (np.row_stride != 0 && np.row_stride != np.dim) ||
      rms_norm_kernel_for(np) != RmsNormKernel::kVecOnePass)
    return false;
  auto overlap = [&](const void* a, const void* b) {
    return byte_ranges_overlap(a, bytes, b, bytes);
  };
  if (overlap(np.out, e.out) || overlap(np.residual, e.out) || overlap(np.out, np.residual) ||
      overlap(np.out, e.add) || overlap(np.residual, e.add))
    return false;
  recorder_.drop_last();
  e.norm_out = np.out;
  e.norm_residual = np.residual;
  e.norm_w = np.weight;
  e.norm_eps = np.eps;
  e.norm_w_f32 = np.weight_f32;
  record(kOpMoeExperts, e, run_moe_experts);
  return true;
}

}  // namespace strata::cuda
