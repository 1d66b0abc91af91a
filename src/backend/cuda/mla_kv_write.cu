// The MLA latent KV write: each new token's bf16 row [latent (R) | rope (P)] encoded into its
// slot of one layer, for every row format of mla_attention.h, bit for bit the bytes of
// backend/kv_format.cc's encode_k_row (mla_row_encode.cuh says how; the parity test compares
// them). One warp per token (a row is at most a few hundred values); 4 tokens a block.
#include "backend/cuda/mla_device.cuh"
#include "backend/cuda/mla_row_encode.cuh"

namespace strata::cuda {
namespace {

constexpr int kWarps = 4;

__global__ void __launch_bounds__(kWarps * 32) mla_kv_write_kernel(MlaKvWriteParams p) {
  pdl_wait();
  pdl_trigger();
  const int lane = threadIdx.x % 32;
  const int64_t t = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (t >= p.tokens) return;
  char* row = static_cast<char*>(p.cache) + int64_t(p.slots[t]) * p.fmt.row_bytes;
  mla::encode_row(p.src + t * p.src_stride, row, p.fmt, 0, 1, lane);
}

}  // namespace

void launch_mla_kv_write(const MlaKvWriteParams& p, cudaStream_t stream) {
  if (p.tokens == 0) return;
  mla::launch(mla_kv_write_kernel, dim3(unsigned((p.tokens + kWarps - 1) / kWarps)),
              dim3(kWarps * 32), 0, stream, p);
  CUDA_LAUNCH_CHECK();
}

}  // namespace strata::cuda
