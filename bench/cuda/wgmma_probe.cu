// The tensor-core ceiling of the MoE prefill GEMM's consumer loop (moe_experts_gemm_pipe.cu),
// with no copies at all: what its instruction forms can issue when the data is always there.
//
// Why: at 8,192 tokens the pipe kernel's gate_up runs at ~52% of the cuBLAS bf16 rate in every
// weight format (bf16 Moonlight, FP8 DeepSeek-V3, INT4 Kimi-K2.5; ncu: tensor pipe 54-55%),
// though the formats differ 2x in bytes and in dequantization work. Something they share caps
// them; this program takes the copies, the barriers and the gather away and times the consumer
// loop alone (2 consumer warpgroups x 2 m64 blocks, wgmma n = 128 against one x tile, 8 wgmma a
// 64-column step, fragments double-buffered, wait<1>), one form at a time:
//   rs        A fragments fixed in registers: the register-A wgmma's own rate
//   rs_lds    + each step's A fragments read from shared memory (the bf16 path: no conversion)
//   rs_fp8    + the FP8 block-scaled dequantization (moe::fragment<kMoeFp8>, the product's)
//   rs_int4   + the INT4 group-32 dequantization (moe::fragment<kMoeInt4>)
//   ss        A from shared memory too (m64n128k16 with both descriptors): the form cuBLAS-like
//             kernels use, for comparison
//   rs_n64    rs at wgmma n = 64 (the pipe kernel's tail tiles)
// Each prints TFLOP/s and % of the cuBLAS bf16 GEMM rate measured in the same run.
// Found (H100, 2026-12-06, bench/results/2026-12-06-session36.md; that run filled shared memory
// with one constant, which draws less power than the random data of the cuBLAS ceiling, so read
// the forms against each other): rs 720 (first, clocks still ramping), rs_lds 841, rs_fp8 733,
// rs_int4 855, ss 894, rs_n64 897 TFLOP/s against cuBLAS's 669 in that process. The consumer loop
// alone issues at the ceiling in every format; FP8's conversions cost ~13% of it, INT4's
// dequantization nothing. What holds the pipe kernel at ~52% is its data path (ncu: L2 at 72%
// of its throughput, the most loaded unit), not the loop. A form with the e4m3 bytes unpacked
// by integer ops (one conversion a pair instead of two, same bits) read 653: dropped.
// Usage: strata_bench_wgmma_probe [--steps 512] [--waves 4] [--reps 10]
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "backend/cuda/attention_wgmma.cuh"
#include "backend/cuda/moe_experts.cuh"
#include "bench_timing.h"

namespace {

using namespace strata::cuda;
using namespace strata::cuda::moe;
using attn::make_smem_desc;
using strata::cuda::int4::lds128;  // (plain `int4::` would also name the CUDA vector type)
using strata::cuda::int4::lds32;

enum Form : int { kRs = 0, kRsLds, kRsFp8, kRsInt4, kSs, kRsN64, kForms };
const char* const kFormNames[] = {"rs", "rs_lds", "rs_fp8", "rs_int4", "ss", "rs_n64"};

constexpr int kThreads = 384;  // the pipe kernel's: 2 consumer warpgroups + 1 of producers
constexpr int kNB = 2;         // m64 blocks a consumer warpgroup
constexpr int kXBytes = 128 * 128;
// Shared memory: 4 stages of an x tile (16 KB) + the CTA's 16 row tiles' weights of a step at
// bf16 (16 x 2 KB; fp8 and int4 read the first half / quarter) + scales; the SS form's A blocks
// (4 x 64 rows x 128 B) in the weights' place.
constexpr int kStages = 4;
constexpr int kWBytes = 16 * 2048;
constexpr int kStage = kXBytes + kWBytes + 1024;
constexpr int kSmem = kStages * kStage + 1024;

// The pipe kernel's fragments() (moe_experts_gemm_pipe.cu, file-local there) on this program's
// stage layout: the same shared loads and moe::fragment calls, so the forms time its loop.
template <int F>
__device__ __forceinline__ void make_fragments(uint32_t stage, int warp, uint32_t (&a)[kNB][4][4]) {
  constexpr int kTiles = F == kMoeBf16 ? 4 : F == kMoeInt4 ? 1 : 2;  // 64 / moe_tile_k(F)
  constexpr int kTileBytes = F == kMoeBf16 ? 2048 : F == kMoeInt4 ? 512 : 1024;
  const int lane = int(threadIdx.x) % 32;
  const uint32_t ss = stage + kXBytes + kWBytes;
#pragma unroll
  for (int b = 0; b < kNB; ++b) {
    const int t = (warp / 4) * 8 + 4 * b + warp % 4;
    TileScale sc{0, 0};
    if constexpr (F == kMoeInt4) {
      const uint32_t at = ss + uint32_t((t % 8) * 64 + (lane / 4) * 4);
      sc.s0 = lds32(at);
      sc.s1 = lds32(at + 32);
    } else if constexpr (F == kMoeFp8) {
      sc.s0 = lds32(ss + uint32_t((warp / 4) * 4));
    }
    const uint32_t w = stage + kXBytes + uint32_t(t * kTileBytes + lane * 16);
#pragma unroll
    for (int tt = 0; tt < kTiles; ++tt) {
      const uint4 q = lds128(w + uint32_t(tt * kMoeTileBytes));
#pragma unroll
      for (int s = 0; s < kSteps<F>; ++s) fragment<F>(q, sc, s, a[b][tt * kSteps<F> + s]);
    }
    attn::reg_fence(a[b]);
  }
}

// The consumer loop of one form: `steps` 64-column steps over the stages in turn.
template <int Form>
__device__ __forceinline__ void consume(uint32_t smem, int warp, int steps, float* out) {
  constexpr int N = Form == kRsN64 ? 64 : 128;
  constexpr int F = Form == kRsFp8 ? kMoeFp8 : Form == kRsInt4 ? kMoeInt4 : kMoeBf16;
  constexpr bool kLoad = Form == kRsLds || Form == kRsFp8 || Form == kRsInt4;
  float acc[kNB][64];
#pragma unroll
  for (int b = 0; b < kNB; ++b)
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[b][i] = 0.0f;
  uint32_t a0[kNB][4][4], a1[kNB][4][4];
  make_fragments<kMoeBf16>(smem, warp, a0);
  make_fragments<kMoeBf16>(smem, warp, a1);
  auto stage_of = [&](int j) { return smem + uint32_t(j % kStages) * kStage; };
  auto step = [&](int j, uint32_t(&cur)[kNB][4][4], uint32_t(&nxt)[kNB][4][4]) {
    const uint32_t xb = stage_of(j);
    attn::wgmma_fence();
#pragma unroll
    for (int b = 0; b < kNB; ++b)
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        if constexpr (Form == kSs) {
          const uint32_t ab = xb + kXBytes + uint32_t(((warp / 4) * 2 + b) * 8192);
          attn::wgmma_ss_m64n128k16<0>(acc[b], make_smem_desc(ab + 32 * s, 16, 1024),
                                       make_smem_desc(xb + 32 * s, 16, 1024), 1);
        } else {
          attn::wgmma_rs_n<N>(acc[b], cur[b][s], make_smem_desc(xb + 32 * s, 16, 1024));
        }
      }
    attn::wgmma_commit();
    attn::wgmma_wait<1>();
    if constexpr (kLoad)
      if (j + 1 < steps) make_fragments<F>(stage_of(j + 1), warp, nxt);
  };
  for (int j = 0; j < steps; j += 2) {
    step(j, a0, a1);
    if (j + 1 < steps) step(j + 1, a1, a0);
  }
  attn::wgmma_wait<0>();
  float sum = 0.0f;
#pragma unroll
  for (int b = 0; b < kNB; ++b) {
    attn::reg_fence<64>(acc[b]);
#pragma unroll
    for (int i = 0; i < 64; ++i) sum += acc[b][i];
  }
  if (sum == 12345.0f) out[threadIdx.x] = sum;  // keeps the work (an exact 12345 never comes)
}

template <int Form>
__global__ void __launch_bounds__(kThreads, 1) probe_kernel(int steps, float* out) {
  extern __shared__ __align__(128) char smem_raw[];
  uint32_t smem = smem_addr(smem_raw);
  smem += (1024 - (smem & 1023)) & 1023;
  // Pseudo-random bits, as the cuBLAS ceiling's random data (a constant fill draws less power
  // and read 107-134% of that ceiling, 2026-12-06): bf16 halves of random sign and mantissa in
  // [2^-7, 1), whose bytes are never e4m3 NaNs (0x7f / 0xff) and whose scale words are finite.
  for (int i = int(threadIdx.x); i < kStages * kStage / 4; i += kThreads) {
    uint32_t h = uint32_t(i) * 2654435761u + blockIdx.x * 40503u;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    const uint32_t v = (h & 0x80778077u) | 0x3c003c00u;
    asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(smem + 4 * i), "r"(v));
  }
  __syncthreads();
  const int warp = __shfl_sync(~0u, int(threadIdx.x) / 32, 0);
  if (warp >= 8) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 56;\n");
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 224;\n");
  consume<Form>(smem, warp, steps, out);
}

template <int Form>
double run_form(cudaStream_t s, int blocks, int steps, int reps, float* out) {
  CUDA_CHECK(
      cudaFuncSetAttribute(probe_kernel<Form>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  const double ms = strata::bench::time_ms(s, 2, reps, [&] {
    probe_kernel<Form><<<blocks, kThreads, kSmem, s>>>(steps, out);
    CUDA_CHECK(cudaGetLastError());
  });
  const double n = Form == kRsN64 ? 64 : 128;
  return double(blocks) * steps * 2 * 4 * kNB * 2.0 * 64 * n * 16 / (ms * 1e-3) / 1e12;
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 512, waves = 4, reps = 10;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--steps")
      steps = std::atoi(argv[i + 1]);
    else if (a == "--waves")
      waves = std::atoi(argv[i + 1]);
    else if (a == "--reps")
      reps = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: %s [--steps 512] [--waves 4] [--reps 10]\n", argv[0]);
      return 2;
    }
  }
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device   %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  cudaStream_t s;
  CUDA_CHECK(cudaStreamCreate(&s));
  const auto ceil = strata::bench::measure_ceilings(s);
  float* out = nullptr;
  CUDA_CHECK(cudaMalloc(&out, kThreads * sizeof(float)));
  const int blocks = prop.multiProcessorCount * waves;
  double tf[kForms];
  tf[kRs] = run_form<kRs>(s, blocks, steps, reps, out);
  tf[kRsLds] = run_form<kRsLds>(s, blocks, steps, reps, out);
  tf[kRsFp8] = run_form<kRsFp8>(s, blocks, steps, reps, out);
  tf[kRsInt4] = run_form<kRsInt4>(s, blocks, steps, reps, out);
  tf[kSs] = run_form<kSs>(s, blocks, steps, reps, out);
  tf[kRsN64] = run_form<kRsN64>(s, blocks, steps, reps, out);
  for (int f = 0; f < kForms; ++f)
    std::printf("probe    %-8s %7.1f TFLOP/s = %5.1f%% of GEMM (%d CTAs x %d steps)\n",
                kFormNames[f], tf[f], 100.0 * tf[f] / ceil.gemm_tflops, blocks, steps);
  CUDA_CHECK(cudaFree(out));
  return 0;
}
