// MLA's attention inputs in one launch (mla_inputs.h says what and why it gives the separate ops'
// bits). One block per token: the latent's squares summed in the order of the kernel
// launch_rms_norm would take (kVecOnePass: thread i holds values [8i, 8i + 8), R / 8 threads;
// kWarp: warp 0, lane l values l + 32j), both ropes over every thread, the finished row staged in
// shared memory, then every warp encodes a share of it into the token's slot as the latent KV
// write does (mla_row_encode.cuh: the same bytes whichever warp encodes a value).
#include "backend/cuda/bulk_copy.cuh"
#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/mla_inputs.cuh"
#include "backend/cuda/mla_inputs.h"
#include "backend/cuda/norm.h"

namespace strata::cuda {
namespace {

constexpr int kThreads = kMlaInputsThreads;

__global__ void __launch_bounds__(kThreads) mla_inputs_kernel(MlaInputsParams p) {
  // The norm's weights, read after the row's reduction, into L2 before the wait: at batch 1 this
  // one block sits on the step's critical path, and the step's weight streams have evicted them.
  // One bulk prefetch (the TMA engine) of the 16-byte multiple the weights fill.
  if (p.norm_prefetch && threadIdx.x == 0 && uintptr_t(p.norm) % 16 == 0) {
    const uint32_t wbytes = uint32_t(p.fmt.latent * (p.norm_f32 ? 4 : 2)) & ~15u;
    if (wbytes > 0) bulk_prefetch_l2(p.norm, wbytes);
  }
  pdl_enter(p.pdl_early);
  __shared__ __align__(16) uint16_t row_s[kMlaInputsMaxLatent + 2 * kMaxRopeHalf];  // the cache row
  __shared__ float warp_ss[kThreads / 32];
  const int64_t t = blockIdx.x;
  const int tid = threadIdx.x;
  const int R = p.fmt.latent, P = p.fmt.rope;
  const int32_t position = p.positions[t];
  // q's rope dims of every head: rotated in q and copied into q_latent's rope columns.
  for (int idx = tid; idx < p.heads * p.half; idx += kThreads) {
    const int h = idx / p.half, i = idx - h * p.half;
    int d0, d1;
    mla_rope_pair_dims(p, i, &d0, &d1);
    bf16_bits* qh = p.q + (t * p.heads + h) * p.q_stride + p.q_offset;
    bf16_bits* lh = p.q_latent + (t * p.heads + h) * (R + P) + R;
    bf16_bits o0, o1;
    rope_pair(bf16_to_float(qh[d0]), bf16_to_float(qh[d1]), position, p.inv_freq[i],
              p.attention_factor, &o0, &o1);
    qh[d0] = o0;
    qh[d1] = o1;
    lh[d0] = o0;
    lh[d1] = o1;
  }
  mla_cache_row(p, t, row_s, warp_ss);
}

}  // namespace

void launch_mla_inputs(const MlaInputsParams& p, const Launch& launch) {
  CHECK(p.fmt.latent <= kMlaInputsMaxLatent && p.half <= kMaxRopeHalf && p.fmt.rope == 2 * p.half);
  CHECK(p.norm_vec ? p.fmt.latent % 8 == 0 : p.fmt.latent <= 256);
  if (p.tokens == 0) return;
  launch_pdl(mla_inputs_kernel, dim3(unsigned(p.tokens)), dim3(kThreads), 0, launch, p);
  CUDA_LAUNCH_CHECK();
}

// ---- host entry ----
bool CudaBackend::mla_inputs_fusable(const Tensor& kv_row, const Tensor& norm, const Tensor& q,
                                     const Tensor& q_latent, const MlaInputsArgs& args,
                                     const KvStorage& kv, const AttentionMetadata& meta) const {
  const KvLayout& lay = kv.layout();
  const int64_t t = kv_row.dim(0), latent = norm.numel(), rope = args.rope.rotary_dim;
  const RmsNormKernel norm_kernel = rms_norm_kernel_for(mla_inputs_norm(kv_row, norm));
  return tunables_.fusion && tunables_.mla_inputs_fusion && kv_row.rank() == 2 && q.rank() == 3 &&
         kv_row.dim(1) == latent + rope && kv_row.dtype == DType::kBF16 &&
         q.dtype == DType::kBF16 && q_latent.dtype == DType::kBF16 && kv_row.is_contiguous() &&
         q.is_contiguous() && q_latent.is_contiguous() && q.dim(0) == t && t == meta.num_tokens &&
         q_latent.numel() == t * q.dim(1) * (latent + rope) &&
         (norm.dtype == DType::kBF16 || norm.dtype == DType::kF32) && rope % 2 == 0 &&
         rope / 2 <= kMaxRopeHalf && args.q_rope_offset >= 0 &&
         args.q_rope_offset + rope <= q.dim(2) && lay.v_dim == 0 && lay.k_dim == latent + rope &&
         (lay.rope_dim == rope || lay.rope_dim == 0) && latent <= kMlaInputsMaxLatent &&
         (norm_kernel == RmsNormKernel::kVecOnePass || norm_kernel == RmsNormKernel::kWarp);
}

// The separate norm's kernel on the cache rows (rms_norm_columns' parameters): the fused launches
// follow its order of summation, so they take only the two orders they implement.
RmsNormParams CudaBackend::mla_inputs_norm(const Tensor& kv_row, const Tensor& norm) {
  auto np = zeroed<RmsNormParams>();
  np.x = kv_row.ptr<bf16_bits>();
  np.weight = norm.data;
  np.out = kv_row.ptr<bf16_bits>();
  np.rows = kv_row.dim(0);
  np.row_stride = kv_row.rank() == 2 ? kv_row.dim(1) : 0;
  np.dim = int(norm.numel());
  return np;
}

MlaInputsParams CudaBackend::mla_inputs_params(const Tensor& kv_row, const Tensor& norm,
                                               const Tensor& q, const Tensor& q_latent,
                                               const MlaInputsArgs& args, KvStorage& kv, int layer,
                                               const AttentionMetadata& meta) {
  const KvLayout& lay = kv.layout();
  for (int i = 0; i < meta.num_tokens; ++i) {
    const int64_t slot = meta.slot_mapping[i];
    CHECK_MSG(slot >= 0 && slot < lay.num_pages * lay.page_size, "slot {} out of pool", slot);
  }
  const int64_t rope = args.rope.rotary_dim;
  const int half = int(rope / 2);
  const DeviceMeta& dm = device_meta(meta);
  auto p = zeroed<MlaInputsParams>();
  p.kv_row = kv_row.ptr<bf16_bits>();
  p.norm = norm.data;
  p.q = q.ptr<bf16_bits>();
  p.q_latent = q_latent.ptr<bf16_bits>();
  p.cache = kv.k(layer).data;
  p.positions = dm.positions;
  p.slots = dm.slot_mapping;
  p.tokens = kv_row.dim(0);
  p.kv_stride = kv_row.dim(1);
  p.fmt = mla_layer_row_format(lay, layer, int(rope), kv.k_scale(layer));
  p.heads = int(q.dim(1));
  p.q_stride = int(q.dim(2));
  p.q_offset = args.q_rope_offset;
  p.norm_f32 = norm.dtype == DType::kF32;
  p.norm_vec = rms_norm_kernel_for(mla_inputs_norm(kv_row, norm)) == RmsNormKernel::kVecOnePass;
  p.half = half;
  p.interleaved = args.rope.interleaved;
  p.pdl_early = tunables_.pdl_early;
  p.norm_prefetch = tunables_.mla_inputs_norm_prefetch;
  p.eps = args.eps;
  p.attention_factor = args.rope.attention_factor;
  for (int i = 0; i < half; ++i) p.inv_freq[i] = args.rope.inv_freq[i];
  return p;
}

void CudaBackend::mla_attention_inputs(const Tensor& kv_row, const Tensor& norm, const Tensor& q,
                                       const Tensor& q_latent, const MlaInputsArgs& args,
                                       KvStorage& kv, int layer, const AttentionMetadata& meta) {
  if (!mla_inputs_fusable(kv_row, norm, q, q_latent, args, kv, meta)) {
    Backend::mla_attention_inputs(kv_row, norm, q, q_latent, args, kv, layer, meta);
    return;
  }
  if (kv_row.dim(0) == 0) return;
  begin_op();
  record(kOpMlaInputs, mla_inputs_params(kv_row, norm, q, q_latent, args, kv, layer, meta),
         launch_mla_inputs);
}

}  // namespace strata::cuda
