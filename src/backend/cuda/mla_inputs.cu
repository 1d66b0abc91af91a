// MLA's attention inputs in one launch (mla_inputs.h says what and why it gives the separate ops'
// bits). One block per token: the latent's squares summed in the order of the kernel
// launch_rms_norm would take (kVecOnePass: thread i holds values [8i, 8i + 8), R / 8 threads;
// kWarp: warp 0, lane l values l + 32j), both ropes over every thread, the finished row staged in
// shared memory, then every warp encodes a share of it into the token's slot as the latent KV
// write does (mla_row_encode.cuh: the same bytes whichever warp encodes a value).
#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/mla_inputs.h"
#include "backend/cuda/mla_row_encode.cuh"
#include "backend/cuda/norm.h"
#include "backend/cuda/rope.cuh"

namespace strata::cuda {
namespace {

constexpr int kThreads = 256;
static_assert(kMlaInputsMaxLatent / 8 <= kThreads, "the vec norm layout needs R / 8 threads");

__device__ __forceinline__ float norm_weight(const MlaInputsParams& p, int i) {
  return p.norm_f32 ? static_cast<const float*>(p.norm)[i]
                    : bf16_to_float(static_cast<const bf16_bits*>(p.norm)[i]);
}

// The rotated pair i's two dims within a head's rope part.
__device__ __forceinline__ void pair_dims(const MlaInputsParams& p, int i, int* d0, int* d1) {
  *d0 = p.interleaved ? 2 * i : i;
  *d1 = p.interleaved ? 2 * i + 1 : i + p.half;
}

__global__ void __launch_bounds__(kThreads) mla_inputs_kernel(MlaInputsParams p) {
  pdl_enter(p.pdl_early);
  __shared__ __align__(16) uint16_t row_s[kMlaInputsMaxLatent + 2 * kMaxRopeHalf];  // the cache row
  __shared__ float warp_ss[kThreads / 32];
  const int64_t t = blockIdx.x;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int R = p.fmt.latent, P = p.fmt.rope;
  bf16_bits* kv = p.kv_row + t * p.kv_stride;
  const int32_t position = p.positions[t];

  // The latent's squares, in the order of the separate norm's kernel.
  const int nchunk = R / 8;
  const bool holds = p.norm_vec ? tid < nchunk : warp == 0;
  float v[8];
  float ss = 0;
  if (p.norm_vec) {
    if (holds) {
      unpack8(reinterpret_cast<const uint4*>(kv)[tid], v);
#pragma unroll
      for (int e = 0; e < 8; ++e) ss += v[e] * v[e];
    }
  } else if (holds) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int i = lane + j * 32;
      if (i < R) {
        v[j] = bf16_to_float(kv[i]);
        ss += v[j] * v[j];
      }
    }
  }

  // The cache row's rope part: rotated in kv_row and staged.
  for (int i = tid; i < p.half; i += kThreads) {
    int d0, d1;
    pair_dims(p, i, &d0, &d1);
    bf16_bits o0, o1;
    rope_pair(bf16_to_float(kv[R + d0]), bf16_to_float(kv[R + d1]), position, p.inv_freq[i],
              p.attention_factor, &o0, &o1);
    kv[R + d0] = o0;
    kv[R + d1] = o1;
    row_s[R + d0] = o0;
    row_s[R + d1] = o1;
  }
  // q's rope dims of every head: rotated in q and copied into q_latent's rope columns.
  for (int idx = tid; idx < p.heads * p.half; idx += kThreads) {
    const int h = idx / p.half, i = idx - h * p.half;
    int d0, d1;
    pair_dims(p, i, &d0, &d1);
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

  // The sum: the xor butterfly within each warp; the vec order adds the holding warps' sums in
  // warp order (norm.cu block_sum over a block of ceil(R / 256) warps).
  if (p.norm_vec ? warp < (nchunk + 31) / 32 : warp == 0) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  }
  if (p.norm_vec) {
    if (lane == 0) warp_ss[warp] = ss;
    __syncthreads();
    float total = 0;
    for (int w = 0; w < (nchunk + 31) / 32; ++w) total += warp_ss[w];
    ss = total;
  }
  const float inv = rsqrtf(ss / float(R) + p.eps);
  if (holds) {
    if (p.norm_vec) {
      float o[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) o[e] = norm_weight(p, 8 * tid + e) * (v[e] * inv);
      const uint4 bits = pack8(o);
      reinterpret_cast<uint4*>(kv)[tid] = bits;
      reinterpret_cast<uint4*>(row_s)[tid] = bits;
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int i = lane + j * 32;
        if (i < R) {
          const bf16_bits b = float_to_bf16(norm_weight(p, i) * (v[j] * inv));
          kv[i] = b;
          row_s[i] = b;
        }
      }
    }
  }
  __syncthreads();
  char* row = static_cast<char*>(p.cache) + int64_t(p.slots[t]) * p.fmt.row_bytes;
  mla::encode_row(row_s, row, p.fmt, warp, kThreads / 32, lane);
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
void CudaBackend::mla_attention_inputs(const Tensor& kv_row, const Tensor& norm, const Tensor& q,
                                       const Tensor& q_latent, const MlaInputsArgs& args,
                                       KvStorage& kv, int layer, const AttentionMetadata& meta) {
  const KvLayout& lay = kv.layout();
  const int64_t t = kv_row.dim(0), latent = norm.numel(), rope = args.rope.rotary_dim;
  const int half = int(rope / 2);
  // The separate norm's kernel on this row (rms_norm_columns' parameters): the fused launch
  // follows its order of summation, so it takes only the two orders it implements.
  auto np = zeroed<RmsNormParams>();
  np.x = kv_row.ptr<bf16_bits>();
  np.weight = norm.data;
  np.out = kv_row.ptr<bf16_bits>();
  np.rows = t;
  np.row_stride = kv_row.rank() == 2 ? kv_row.dim(1) : 0;
  np.dim = int(latent);
  const RmsNormKernel norm_kernel = rms_norm_kernel_for(np);
  const bool fused =
      tunables_.fusion && tunables_.mla_inputs_fusion && kv_row.rank() == 2 && q.rank() == 3 &&
      kv_row.dim(1) == latent + rope && kv_row.dtype == DType::kBF16 && q.dtype == DType::kBF16 &&
      q_latent.dtype == DType::kBF16 && kv_row.is_contiguous() && q.is_contiguous() &&
      q_latent.is_contiguous() && q.dim(0) == t && t == meta.num_tokens &&
      q_latent.numel() == t * q.dim(1) * (latent + rope) &&
      (norm.dtype == DType::kBF16 || norm.dtype == DType::kF32) && rope % 2 == 0 &&
      half <= kMaxRopeHalf && args.q_rope_offset >= 0 && args.q_rope_offset + rope <= q.dim(2) &&
      lay.v_dim == 0 && lay.k_dim == latent + rope && (lay.rope_dim == rope || lay.rope_dim == 0) &&
      latent <= kMlaInputsMaxLatent &&
      (norm_kernel == RmsNormKernel::kVecOnePass || norm_kernel == RmsNormKernel::kWarp);
  if (!fused) {
    Backend::mla_attention_inputs(kv_row, norm, q, q_latent, args, kv, layer, meta);
    return;
  }
  for (int i = 0; i < meta.num_tokens; ++i) {
    const int64_t slot = meta.slot_mapping[i];
    CHECK_MSG(slot >= 0 && slot < lay.num_pages * lay.page_size, "slot {} out of pool", slot);
  }
  if (t == 0) return;
  begin_op();
  const DeviceMeta& dm = device_meta(meta);
  auto p = zeroed<MlaInputsParams>();
  p.kv_row = kv_row.ptr<bf16_bits>();
  p.norm = norm.data;
  p.q = q.ptr<bf16_bits>();
  p.q_latent = q_latent.ptr<bf16_bits>();
  p.cache = kv.k(layer).data;
  p.positions = dm.positions;
  p.slots = dm.slot_mapping;
  p.tokens = t;
  p.kv_stride = kv_row.dim(1);
  p.fmt = mla_layer_row_format(lay, layer, int(rope), kv.k_scale(layer));
  p.heads = int(q.dim(1));
  p.q_stride = int(q.dim(2));
  p.q_offset = args.q_rope_offset;
  p.norm_f32 = norm.dtype == DType::kF32;
  p.norm_vec = norm_kernel == RmsNormKernel::kVecOnePass;
  p.half = half;
  p.interleaved = args.rope.interleaved;
  p.pdl_early = tunables_.pdl_early;
  p.eps = args.eps;
  p.attention_factor = args.rope.attention_factor;
  for (int i = 0; i < half; ++i) p.inv_freq[i] = args.rope.inv_freq[i];
  record(kOpMlaInputs, p, launch_mla_inputs);
}

}  // namespace strata::cuda
