// Decode context parallelism's ops on the GPU (backend/dcp_attention.h, arch/dcp.h): MLA attention
// over one rank's shard of each sequence returning partial outputs with their log-sum-exp, and
// the exact merge of the group's partials.
//
// The partial attention is the MLA kernels' own (mla_attention.h): each kernel already leaves
// unnormalized split partials with their (max, sum) for its split-KV merge; with p.positions set
// the key limit of a row is the shard's causal one (local key j is position rank + size · j), and
// the merge writes float32 rows [output | log-sum-exp] instead of bf16 outputs. Nothing new
// attends. What the kernels do not cover runs on the CPU reference (cpu_twin.cc, counted as
// mla_attention).
//
// The merge (this file's kernel): one block a (token, head) row, a thread a column at a time; each
// thread reads the N log-sum-exps (N is the group's ranks: a handful, served from L1) and adds
// the N outputs in part order in float32.
#include <cmath>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/mla_device.cuh"

namespace strata::cuda {
namespace {

constexpr int kMergeThreads = 128;

template <bool kF32Out>
__global__ void __launch_bounds__(kMergeThreads) mla_dcp_merge_kernel(MlaDcpMergeParams p) {
  pdl_wait();
  pdl_trigger();
  const int64_t row = blockIdx.x;  // token · out_heads + head
  const int64_t t = row / p.out_heads, h = row % p.out_heads;
  const int R = p.latent;
  const int64_t part_stride = p.tokens * p.heads * (R + 1);
  const float* first = p.parts + (t * p.heads + h) * (R + 1);
  float mx = -INFINITY;
  for (int n = 0; n < p.parts_n; ++n) mx = fmaxf(mx, first[n * part_stride + R]);
  float total = 0.0f;
  for (int n = 0; n < p.parts_n; ++n) {
    const float lse = first[n * part_stride + R];
    total += lse == -INFINITY ? 0.0f : expf(lse - mx);
  }
  // A row that attended to nothing anywhere (cannot happen: position p sees itself) stays zero.
  const float inv = total > 0.0f ? 1.0f / total : 0.0f;
  for (int col = threadIdx.x; col < R; col += kMergeThreads) {
    float acc = 0.0f;
    for (int n = 0; n < p.parts_n; ++n) {
      const float lse = first[n * part_stride + R];
      if (lse != -INFINITY) acc += expf(lse - mx) * first[n * part_stride + col];
    }
    if constexpr (kF32Out)
      static_cast<float*>(p.out)[row * R + col] = acc * inv;
    else
      static_cast<bf16_bits*>(p.out)[row * R + col] = float_to_bf16(acc * inv);
  }
}

void run_mla_dcp_merge(const MlaDcpMergeParams& p, const Launch& l) {
  launch_mla_dcp_merge(p, l.stream);
}

}  // namespace

void launch_mla_dcp_merge(const MlaDcpMergeParams& p, cudaStream_t stream) {
  if (p.tokens == 0 || p.out_heads == 0) return;
  const dim3 grid(unsigned(p.tokens * p.out_heads));
  if (p.out_f32)
    mla::launch(mla_dcp_merge_kernel<true>, grid, dim3(kMergeThreads), 0, stream, p);
  else
    mla::launch(mla_dcp_merge_kernel<false>, grid, dim3(kMergeThreads), 0, stream, p);
  CUDA_LAUNCH_CHECK();
}

void CudaBackend::mla_attention_partial(const Tensor& q_latent, const KvStorage& kv, int layer,
                                        const AttentionMetadata& meta, const MlaArgs& args,
                                        DcpShard shard, const Tensor& out) {
  CHECK(shard.size >= 1 && shard.rank >= 0 && shard.rank < shard.size);
  CHECK_EQ(int(out.dtype), int(DType::kF32));
  CHECK_EQ(out.numel(), int64_t(meta.num_tokens) * args.num_heads * (args.kv_lora_rank + 1));
  CHECK(out.is_contiguous());
  if (meta.num_tokens == 0) return;
  if (!mla_attention_gpu(q_latent, kv, layer, meta, args, out, &shard))
    mla_attention_partial_cpu_twin(q_latent, kv, layer, meta, args, shard, out);
}

void CudaBackend::merge_attention_partials(const Tensor& parts, const Tensor& out) {
  CHECK_EQ(parts.rank(), 4);
  CHECK_EQ(out.rank(), 3);
  CHECK_EQ(int(parts.dtype), int(DType::kF32));
  CHECK(parts.is_contiguous() && out.is_contiguous());
  CHECK(out.dtype == DType::kBF16 || out.dtype == DType::kF32);
  const int64_t tokens = parts.dim(1), heads = parts.dim(2), latent = parts.dim(3) - 1;
  CHECK_EQ(out.dim(0), tokens);
  CHECK_EQ(out.dim(2), latent);
  CHECK_LE(out.dim(1), heads);
  auto p = zeroed<MlaDcpMergeParams>();
  p.parts = parts.ptr<float>();
  p.out = out.data;
  p.tokens = tokens;
  p.parts_n = int(parts.dim(0));
  p.heads = int(heads);
  p.out_heads = int(out.dim(1));
  p.latent = int(latent);
  p.out_f32 = out.dtype == DType::kF32 ? 1 : 0;
  record(kOpMlaDcpMerge, p, run_mla_dcp_merge);
}

}  // namespace strata::cuda
