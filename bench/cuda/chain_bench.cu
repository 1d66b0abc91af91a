// What a dependent launch costs in a chain of decode kernels. A batch-1 decode step is a chain of
// ~8-12 launches a layer, each dependent on the one before; the W4A16 GEMV's size scan
// (int4_linear_bench --what scan) puts ~4.9 us a launch on top of its streaming (session 32).
// This program times chains of K synthetic kernels shaped like that GEMV (2 blocks an SM held
// resident by shared memory, a ring of 16-byte weight loads issued before the wait, an 8 KB x
// staged after it, the rest streamed, an output the successor reads as its x), in CUDA graphs:
//   --what modes  the ways to wait, at 0 MB (one block, x only: an RMSNorm's shape) and 2 / 8 /
//                 32 MB a kernel, two or one blocks an SM:
//     serial  no programmatic launch: the graph's plain kernel edge
//     pdl     griddepcontrol.wait (the product's: the successor launched early, released once
//             the predecessor grid has completed and flushed)
//     flag    no griddepcontrol.wait: each block of kernel i, after its stores, fences and adds 1
//             to counter i; a block of kernel i + 1 spins (thread 0, ld.acquire) until counter i
//             holds kernel i's blocks; a memset node at the chain's head zeroes the counters
//     flagrl  the same with fence.acq_rel + a relaxed add (CUTLASS's Barrier::arrive_inc)
//     none    no wait at all (the x read is racy: a floor, not a correct chain)
//   --what parts  the register GEMV's traits (kV* below) added one at a time to the product's
//                 .cs loads, under pdl (session 33 ran an earlier form: traits on the no-allocate
//                 loads, the mma on one accumulator chain; not rerun since)
//   --what fused  the same K dependent steps as phases of ONE persistent kernel (a block an SM)
//                 that meet at a grid barrier, each block's share of the next-but-one phase's
//                 weights copied into shared memory (TMA) as soon as a buffer frees, so DRAM
//                 streams through every barrier and x hand-off; against the pdl chain of the
//                 same weights in the same run. The upper bound of fusing a decode layer's
//                 launches (session 34's question: the batch-1 steps are chains of ~5 us fixed
//                 costs, and every single-launch fusion so far paid its round trips back).
//                 Found (H100, 2026-12-05 session 35, bench/results/2026-12-05-session35.md):
//                 no gain. A phase costs its weights at copy rate + 2.2-2.5 us at every size
//                 (0 MB: 2.49 us, the pdl chain's launch 2.13), while the pdl chain hides its
//                 own ~2.1 us from 8 MB up (8 MB: fused 5.4, pdl 3.9 us): the copies ahead did
//                 not stream through the barriers. Neither issuing them from another warp than
//                 the barrier's thread nor a barrier with the phase bit tracked and a release
//                 fence (-0.2 us at 0 MB) changed that.
// as µs a launch, and the same less the weights' time at the measured copy rate.
// Found (H100, 2026-12-05, bench/results/2026-12-05-session33.md): with the weights loaded as the
// product loads them (ld.global.cs), pdl is the fastest correct wait at every size (8 MB: 3.78 us
// a launch, flag 4.26, none 3.29); flag was ahead only with ld.global.nc.L1::no_allocate loads,
// which make pdl ~1 us a launch slower. Counter waits in the product's W4A16 GEMV measured
// slower too (+0.5 us a launch; the patch beside that log). The wait itself costs ~0.5 us of a
// GEMV-shaped launch; the rest of the real GEMV's fixed cost is in the kernel.
// Usage: strata_bench_chain_bench [--what modes|parts|fused] [--kernels 128] [--reps 20]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/bulk_copy.cuh"
#include "backend/cuda/grid_sync.cuh"
#include "backend/cuda/mma_sync.cuh"
#include "bench_timing.h"

namespace {

enum Mode : int { kSerial = 0, kPdl = 1, kFlag = 2, kNone = 3, kFlagRel = 4 };
const char* const kModeNames[] = {"serial", "pdl", "flag", "none", "flagrl"};
constexpr int kModes = 5;

constexpr int kThreads = 256;
constexpr int kRing = 8;      // 16-byte loads in flight a thread (8 warps: 32 KB a block)
constexpr int kXUnits = 512;  // x: 8 KB of 16-byte units

struct Args {
  const uint4* w;  // this kernel's weights (n16 units)
  long long n16;
  const uint4* x_in;  // the predecessor's output
  uint4* x_out;
  unsigned* counters;  // flag mode: counter i = blocks of kernel i done
  int index;
  int prev_blocks;
  uint4* out;  // out_units 16-byte units a block
  int out_units;
};

__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
__device__ __forceinline__ uint4 ld_cs(const uint4* p) { return __ldcs(p); }
// --what parts: the register GEMV's traits (linear_int4_reg.cu) added to the synthetic kernel one
// at a time (V, a bit mask), to find what puts the GEMV's fixed cost a launch (~4.8 us on an H100)
// ~3.8 us above this kernel's with the same loads under the same PDL wait.
constexpr int kVCs = 1;     // weights by ld.global.cs (the GEMV's __ldcs), not nc.L1::no_allocate
constexpr int kVParts = 2;  // each warp streams one contiguous part (the GEMV's split)
constexpr int kVSums = 4;   // x staged as the GEMV: 4 loads a thread, sums over 16 lanes, scatter
constexpr int kVEpi = 8;    // epilogue through shared memory: warps' partials, a barrier, sums
constexpr int kVMma = 16;   // each 16-byte piece: 4 nibble words to fragments, 4 mma.m16n8k16
                            // on two fresh chains, then scaled into the accumulator
constexpr int kVLdg = 32;   // x through the non-coherent path (__ldg, the GEMV's under PDL)
constexpr int kVAll = 63;

template <int MODE, int V>
__global__ void __launch_bounds__(kThreads) chain_kernel(Args a) {
  extern __shared__ uint4 xs[];  // kXUnits used; the rest only holds the SM's residency at 2
  if (MODE != kSerial) asm volatile("griddepcontrol.launch_dependents;");
  const long long tid = (long long)blockIdx.x * kThreads + threadIdx.x;
  const long long stride = (long long)gridDim.x * kThreads;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  // kVParts: warp wg's tiles (32 pieces each) [t0, t1); else grid-strided pieces.
  const long long nw = (long long)gridDim.x * (kThreads / 32),
                  wg = blockIdx.x * (kThreads / 32) + warp;
  const long long tiles = a.n16 / 32, t0 = wg * tiles / nw, t1 = (wg + 1) * tiles / nw;
  auto elem = [&](long long p) { return (V & kVParts) ? (t0 + p) * 32 + lane : tid + p * stride; };
  auto valid = [&](long long p) { return (V & kVParts) ? t0 + p < t1 : tid + p * stride < a.n16; };
  auto load = [&](long long p) {
    if (!valid(p)) return make_uint4(0, 0, 0, 0);
    return (V & kVCs) ? ld_cs(a.w + elem(p)) : ld_stream(a.w + elem(p));
  };
  uint4 r[kRing];
#pragma unroll
  for (int u = 0; u < kRing; ++u) r[u] = load(u);  // weights are never written: before the wait
  if (MODE == kPdl) asm volatile("griddepcontrol.wait;" ::: "memory");
  if ((MODE == kFlag || MODE == kFlagRel) && a.index > 0) {
    if (threadIdx.x == 0)
      while (strata::cuda::ld_acquire_gpu(a.counters + a.index - 1) < unsigned(a.prev_blocks)) {
      }
    __syncthreads();
  }
  float* sums = reinterpret_cast<float*>(xs + kXUnits);  // kVSums: 64 groups; kVEpi: partials
  if (V & kVSums) {  // 512 pieces: 4 loads a thread (2 valid), sums over 16 lanes, scattered words
    uint32_t* xw = reinterpret_cast<uint32_t*>(xs);
    for (int q0 = threadIdx.x - lane; q0 < kXUnits; q0 += 4 * kThreads) {
      uint4 v[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int q = q0 + u * kThreads + lane;
        v[u] = q >= kXUnits  ? make_uint4(0, 0, 0, 0)
               : (V & kVLdg) ? __ldg(a.x_in + q)
                             : __ldcg(a.x_in + q);
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int q = q0 + u * kThreads + lane;
        if (q0 + u * kThreads >= kXUnits) break;
        const uint32_t w4[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
        float sum = 0;
#pragma unroll
        for (int j = 0; j < 4; ++j)
          sum += __uint_as_float(w4[j] << 16) + __uint_as_float(w4[j] & 0xffff0000u);
        for (int o = 1; o < 16; o <<= 1) sum += __shfl_xor_sync(~0u, sum, o);
        uint32_t* dst = xw + (((q / 8) * 32 + (((q % 8) / 2) ^ (q & 1)) * 4 + (q % 2)) & 2047);
        dst[0] = v[u].x;
        dst[8] = v[u].y;
        dst[16] = v[u].z;
        dst[24] = v[u].w;
        if (lane % 16 == 0) sums[q / 16] = -136.0f * sum;
      }
    }
  } else {
    for (int i = threadIdx.x; i < kXUnits; i += kThreads)
      xs[i] = (V & kVLdg) ? __ldg(a.x_in + i) : __ldcg(a.x_in + i);
  }
  __syncthreads();
  unsigned acc = 0;
  float facc[4] = {};
  const long long my = (V & kVParts) ? t1 - t0 : (a.n16 - tid + stride - 1) / stride;
  const long long rounds = my <= 0 ? 0 : (my + kRing - 1) / kRing;
  for (long long round = 0; round < rounds; ++round) {
#pragma unroll
    for (int u = 0; u < kRing; ++u) {
      const uint4 x = xs[(u * 32 + threadIdx.x) % kXUnits];
      if (V & kVMma) {
        const uint4 x2 = xs[(u * 32 + threadIdx.x + 64) % kXUnits];
        const uint32_t words[4] = {r[u].x, r[u].y, r[u].z, r[u].w};
        const uint32_t xb[8] = {x.x, x.y, x.z, x.w, x2.x, x2.y, x2.z, x2.w};
        // As the GEMV: two chains (even / odd k steps) that start fresh each scale group (here
        // each piece), then summed into the running accumulator.
        float g[2][4] = {};
#pragma unroll
        for (int s = 0; s < 4; ++s) {
          uint32_t af[4];
#pragma unroll
          for (int j = 0; j < 4; ++j) af[j] = ((words[s] >> (4 * j)) & 0x000f000fu) | 0x43004300u;
          strata::cuda::mma_bf16_16816(g[s % 2], af, xb[2 * s], xb[2 * s + 1]);
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) facc[j] = fmaf(1.5f, g[0][j] + g[1][j], facc[j]);
      } else {
        acc += (r[u].x ^ x.x) + (r[u].y ^ x.y) + (r[u].z ^ x.z) + (r[u].w ^ x.w);
      }
      r[u] = load((round + 1) * kRing + u);
    }
  }
  acc += __float_as_uint(facc[0] + facc[1] + facc[2] + facc[3]);
  if (V & kVEpi) {  // each warp's 64 partials, then 64 outputs summed over the 8 warps
    __syncthreads();
    sums[64 + warp * 64 + lane] = float(acc);
    sums[64 + warp * 64 + lane + 32] = float(acc >> 1);
    __syncthreads();
    if (threadIdx.x < 64) {
      float t = 0;
      for (int w = 0; w < kThreads / 32; ++w) t += sums[64 + w * 64 + threadIdx.x];
      acc = __float_as_uint(t);
      reinterpret_cast<uint16_t*>(a.out)[blockIdx.x * 64 + threadIdx.x] = uint16_t(acc >> 16);
    }
  }
  if (a.n16 == 0) acc = xs[threadIdx.x].x;
  // The output (the successor's x): every block writes its share, so every block is a producer;
  // out_units > 0: each block also writes that many 16-byte units of its own (a GEMV's rows).
  for (long long i = tid; i < kXUnits; i += stride) a.x_out[i] = make_uint4(acc, acc + 1, 0, 0);
  for (int i = threadIdx.x; i < a.out_units; i += kThreads)
    a.out[(long long)blockIdx.x * a.out_units + i] = make_uint4(acc, i, 0, 0);
  if (acc == 0x9e3779b9u) a.x_out[kXUnits] = make_uint4(acc, 0, 0, 0);  // keeps the sums live
  if (MODE == kFlag) {
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();
      atomicAdd(a.counters + a.index, 1u);
    }
  }
  if (MODE == kFlagRel) {  // fence.acq_rel + relaxed add (CUTLASS's Barrier::arrive_inc)
    __syncthreads();
    if (threadIdx.x == 0)
      asm volatile("fence.acq_rel.gpu;\n\tred.relaxed.gpu.global.add.u32 [%0], 1;" ::"l"(
                       a.counters + a.index)
                   : "memory");
  }
}

// --what fused: K phases in one kernel. Phase i reads x_i (the previous phase's output, 8 KB),
// streams its weights w[i] (n16 units, block b's share the contiguous [b n16 / grid, (b + 1)
// n16 / grid)), and writes x_{i+1}; the blocks meet at a grid barrier between phases. A block's
// first smem_units of each share come from shared memory: two buffers, the share of phase i + 2
// copied into phase i's buffer once the block is done with it (before the barrier it then waits
// at); the rest of a share, where it exceeds a buffer, is loaded from global memory after the
// barrier as the chain kernel loads it.
struct FusedArgs {
  const uint4* const* w;  // [phases] weight buffers
  long long n16;
  uint4* x;  // two x buffers of kXUnits + 1 units (ping-pong)
  unsigned* barrier;
  int phases;
  int buf_units;  // each shared-memory buffer, 16-byte units
};

__global__ void __launch_bounds__(kThreads, 1) fused_kernel(FusedArgs a) {
  extern __shared__ __align__(128) uint4 fs[];  // [2][buf_units] weights, then x (kXUnits)
  __shared__ __align__(8) uint64_t bars[2];
  uint4* xs = fs + 2 * a.buf_units;
  const int grid = int(gridDim.x), b = int(blockIdx.x);
  const long long u0 = b * a.n16 / grid, u1 = (b + 1) * a.n16 / grid, share = u1 - u0;
  const long long in_smem = share < a.buf_units ? share : a.buf_units;
  const uint32_t bar0 = uint32_t(__cvta_generic_to_shared(&bars[0]));
  const uint32_t buf0 = uint32_t(__cvta_generic_to_shared(fs));
  auto prefetch = [&](int phase) {  // one thread: phase's share into buffer phase % 2
    if (phase >= a.phases || in_smem == 0) return;
    const int k = phase % 2;
    strata::cuda::mbar_arrive_expect_tx(bar0 + 8 * k, uint32_t(in_smem * 16));
    constexpr long long kChunk = 2048;  // 32 KB a bulk copy
    for (long long off = 0; off < in_smem; off += kChunk)
      strata::cuda::bulk_copy_g2s(
          buf0 + uint32_t((k * a.buf_units + off) * 16), a.w[phase] + u0 + off,
          uint32_t((in_smem - off < kChunk ? in_smem - off : kChunk) * 16), bar0 + 8 * k);
  };
  if (threadIdx.x == 0) {
    strata::cuda::mbar_init(bar0, 1);
    strata::cuda::mbar_init(bar0 + 8, 1);
    strata::cuda::mbar_init_fence();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    prefetch(0);
    prefetch(1);
  }
  const long long tid = threadIdx.x;
  for (int i = 0; i < a.phases; ++i) {
    const int k = i % 2;
    // The grid is one block an SM with all of its shared memory: resident at once, so the
    // barrier's timeout (1 s) only catches an SM held by other work, and a wrong run stops.
    if (i > 0 && !strata::cuda::grid_barrier(a.barrier, 1000000000ull)) __trap();
    const uint4* x_in = a.x + (i % 2) * (kXUnits + 1);
    uint4* x_out = a.x + ((i + 1) % 2) * (kXUnits + 1);
    for (int j = threadIdx.x; j < kXUnits; j += kThreads) xs[j] = __ldcg(x_in + j);
    __syncthreads();
    unsigned acc = 0;
    // The share's rest from global memory first (its loads in flight while the copy lands).
#pragma unroll 8
    for (long long u = u0 + in_smem + tid; u < u1; u += kThreads) {
      const uint4 w = __ldcs(a.w[i] + u), x = xs[u % kXUnits];
      acc += (w.x ^ x.x) + (w.y ^ x.y) + (w.z ^ x.z) + (w.w ^ x.w);
    }
    if (in_smem > 0) strata::cuda::mbar_wait(bar0 + 8 * k, uint32_t((i / 2) % 2));
    const uint4* wb = fs + k * a.buf_units;
    for (long long u = tid; u < in_smem; u += kThreads) {
      const uint4 w = wb[u], x = xs[(u0 + u) % kXUnits];
      acc += (w.x ^ x.x) + (w.y ^ x.y) + (w.z ^ x.z) + (w.w ^ x.w);
    }
    // The output (the next phase's x): every block writes its share.
    for (long long j = b * kThreads + tid; j < kXUnits; j += (long long)grid * kThreads)
      x_out[j] = make_uint4(acc, acc + 1, 0, 0);
    if (acc == 0x9e3779b9u) x_out[kXUnits] = make_uint4(acc, 0, 0, 0);  // keeps the sums live
    strata::cuda::fence_proxy_async_smem();  // this thread's reads of buffer k before its refill
    __syncthreads();
    if (threadIdx.x == 0) prefetch(i + 2);
  }
}

using KernelFn = void (*)(Args);
template <int V>
KernelFn kernel_of_v(int mode) {
  switch (mode) {
    case kSerial:
      return chain_kernel<kSerial, V>;
    case kPdl:
      return chain_kernel<kPdl, V>;
    case kFlag:
      return chain_kernel<kFlag, V>;
    case kFlagRel:
      return chain_kernel<kFlagRel, V>;
    default:
      return chain_kernel<kNone, V>;
  }
}
// The forms --what parts times: the base with no-allocate loads, then with the product's .cs loads
// and each other trait on top of them, then all.
constexpr int kParts[] = {
    0, kVCs, kVCs | kVParts, kVCs | kVSums, kVCs | kVEpi, kVCs | kVMma, kVCs | kVLdg, kVAll};
template <int I = 0>
KernelFn kernel_of(int mode, int v = 0) {
  if constexpr (I == sizeof(kParts) / sizeof(kParts[0])) {
    return kernel_of_v<0>(mode);
  } else {
    return v == kParts[I] ? kernel_of_v<kParts[I]>(mode) : kernel_of<I + 1>(mode, v);
  }
}

struct Chain {
  int kernels, blocks, smem, out_units, v = 0;
  long long n16;
  std::vector<uint4*> w;
  uint4* x = nullptr;  // two x buffers of kXUnits + 1 units (ping-pong)
  unsigned* counters = nullptr;
  uint4* out = nullptr;
};

// One graph: the counters' memset, then K launches of the mode's kernel.
cudaGraphExec_t capture(const Chain& c, int mode, cudaStream_t s) {
  const KernelFn fn = kernel_of(mode, c.v);
  cudaGraph_t g;
  CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  CUDA_CHECK(cudaMemsetAsync(c.counters, 0, sizeof(unsigned) * c.kernels, s));
  for (int i = 0; i < c.kernels; ++i) {
    Args a{};
    a.w = c.w[size_t(i)];
    a.n16 = c.n16;
    a.x_in = c.x + (i % 2) * (kXUnits + 1);
    a.x_out = c.x + ((i + 1) % 2) * (kXUnits + 1);
    a.counters = c.counters;
    a.index = i;
    a.prev_blocks = c.blocks;
    a.out = c.out;
    a.out_units = c.out_units;
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(unsigned(c.blocks));
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = size_t(c.smem);
    cfg.stream = s;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = mode == kSerial ? 0 : 1;
    CUDA_CHECK(cudaLaunchKernelEx(&cfg, fn, a));
  }
  CUDA_CHECK(cudaStreamEndCapture(s, &g));
  cudaGraphExec_t e;
  CUDA_CHECK(cudaGraphInstantiate(&e, g, 0));
  CUDA_CHECK(cudaGraphDestroy(g));
  return e;
}

// Median µs of one replay of the graph (reps replays, each timed alone after two warm-ups).
double time_us(cudaGraphExec_t e, cudaStream_t s, int reps) {
  return 1e3 * strata::bench::time_ms(s, 2, reps, [&] { CUDA_CHECK(cudaGraphLaunch(e, s)); });
}

}  // namespace

int main(int argc, char** argv) {
  int kernels = 128, reps = 20;
  std::string what = "modes";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--kernels")) kernels = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--what")) what = argv[i + 1];
  }
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t s;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const double gbs = strata::bench::measure_ceilings(s).copy_gbs;
  std::printf("device   %s, %d SMs; copy rate %.0f GB/s\n", prop.name, prop.multiProcessorCount,
              gbs);
  // Shared memory a block that leaves room for exactly two blocks an SM (the GEMV's residency).
  const int smem = int(prop.sharedMemPerMultiprocessor / 2) - 2048;
  for (int m = 0; m < kModes; ++m)
    for (int v : kParts)
      CUDA_CHECK(
          cudaFuncSetAttribute(kernel_of(m, v), cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  // One chain's launches at each of `modes` (alternating, the second round kept), one line each.
  auto measure = [&](long long mb, int blocks, int out_units, int v, std::vector<int> modes) {
    Chain c;
    c.kernels = kernels;
    c.n16 = mb * (1 << 20) / 16;
    c.blocks = blocks;
    c.out_units = out_units;
    c.smem = smem;
    c.v = v;
    for (int i = 0; i < kernels; ++i) {
      uint4* p = nullptr;
      if (mb > 0) {
        CUDA_CHECK(cudaMalloc(&p, size_t(mb) << 20));
        CUDA_CHECK(cudaMemsetAsync(p, i & 0xff, size_t(mb) << 20, s));
      }
      c.w.push_back(p);
    }
    CUDA_CHECK(cudaMalloc(&c.x, sizeof(uint4) * 2 * (kXUnits + 1)));
    CUDA_CHECK(cudaMemsetAsync(c.x, 0, sizeof(uint4) * 2 * (kXUnits + 1), s));
    CUDA_CHECK(cudaMalloc(&c.counters, sizeof(unsigned) * size_t(kernels)));
    CUDA_CHECK(cudaMalloc(&c.out, sizeof(uint4) * size_t(c.blocks) * 128));
    std::vector<cudaGraphExec_t> exec;
    for (int m : modes) exec.push_back(capture(c, m, s));
    std::vector<double> us(modes.size());
    for (int round = 0; round < 2; ++round)
      for (size_t j = 0; j < modes.size(); ++j) us[j] = time_us(exec[j], s, reps) / kernels;
    const double stream_us = double(mb << 20) / (gbs * 1e3);
    for (size_t j = 0; j < modes.size(); ++j)
      std::printf(
          "chain    %2lld MB a kernel, %3d blocks, out %4d B a block, parts %2d, %-6s: %7.2f us a "
          "launch (%6.2f beyond the weights at copy rate)\n",
          mb, c.blocks, 16 * c.out_units, v, kModeNames[modes[j]], us[j], us[j] - stream_us);
    for (cudaGraphExec_t e : exec) CUDA_CHECK(cudaGraphExecDestroy(e));
    for (uint4* p : c.w)
      if (p) CUDA_CHECK(cudaFree(p));
    CUDA_CHECK(cudaFree(c.x));
    CUDA_CHECK(cudaFree(c.counters));
    CUDA_CHECK(cudaFree(c.out));
  };
  const int sms = prop.multiProcessorCount;
  const std::vector<int> all = {kSerial, kPdl, kFlag, kNone, kFlagRel};
  if (what == "modes") {  // weights by ld.global.cs, as the product's GEMVs load them (kVCs)
    measure(0, 1, 0, kVCs, all);  // a one-block kernel (an RMSNorm's shape)
    for (long long mb : {2, 8, 32})
      for (int bps : {2, 1}) measure(mb, bps * sms, 0, kVCs, all);
    measure(8, 2 * sms, 128, kVCs, all);  // with 2 KB / 256 B of output a block
    measure(8, 2 * sms, 16, kVCs, all);
  } else if (what == "fused") {  // one persistent kernel of K phases against the pdl chain
    const int buf_units = int((prop.sharedMemPerBlockOptin - kXUnits * 16 - 1024) / 2 / 16);
    CUDA_CHECK(cudaFuncSetAttribute(fused_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    int(2 * buf_units * 16 + kXUnits * 16)));
    for (long long mb : {0, 2, 8, 13, 32}) {  // 0: the barrier and x's hand-off alone
      measure(mb, 2 * sms, 0, kVCs, {kPdl});
      const long long n16 = mb * (1 << 20) / 16;
      std::vector<uint4*> w(static_cast<size_t>(kernels));
      for (int i = 0; i < kernels && mb > 0; ++i) {
        CUDA_CHECK(cudaMalloc(&w[size_t(i)], size_t(mb) << 20));
        CUDA_CHECK(cudaMemsetAsync(w[size_t(i)], i & 0xff, size_t(mb) << 20, s));
      }
      const uint4** wd = nullptr;
      CUDA_CHECK(cudaMalloc(&wd, sizeof(uint4*) * size_t(kernels)));
      CUDA_CHECK(
          cudaMemcpy(wd, w.data(), sizeof(uint4*) * size_t(kernels), cudaMemcpyHostToDevice));
      FusedArgs a{};
      a.w = wd;
      a.n16 = n16;
      a.phases = kernels;
      a.buf_units = buf_units;
      CUDA_CHECK(cudaMalloc(&a.x, sizeof(uint4) * 2 * (kXUnits + 1)));
      CUDA_CHECK(cudaMemsetAsync(a.x, 0, sizeof(uint4) * 2 * (kXUnits + 1), s));
      CUDA_CHECK(cudaMalloc(&a.barrier, sizeof(unsigned)));
      CUDA_CHECK(cudaMemsetAsync(a.barrier, 0, sizeof(unsigned), s));
      const size_t smem_bytes = size_t(2 * buf_units * 16 + kXUnits * 16);
      const double us = 1e3 *
                        strata::bench::time_ms(s, 2, reps,
                                               [&] {
                                                 fused_kernel<<<sms, kThreads, smem_bytes, s>>>(a);
                                                 CUDA_CHECK(cudaGetLastError());
                                               }) /
                        kernels;
      const double stream_us = double(mb << 20) / (gbs * 1e3);
      const long long share_kb = n16 / sms * 16 / 1024;
      std::printf(
          "fused    %2lld MB a phase, %3d blocks, share %4lld KB a block (%lld KB in shared "
          "memory): %7.2f us a phase (%6.2f beyond the weights at copy rate)\n",
          mb, sms, share_kb, std::min<long long>(share_kb, buf_units * 16 / 1024), us,
          us - stream_us);
      for (uint4* p : w)
        if (p) CUDA_CHECK(cudaFree(p));
      CUDA_CHECK(cudaFree(wd));
      CUDA_CHECK(cudaFree(a.x));
      CUDA_CHECK(cudaFree(a.barrier));
    }
  } else if (what == "parts") {  // the GEMV's traits one at a time, then all, under the PDL wait
    for (long long mb : {8, 32})
      for (int v : kParts)
        measure(mb, 2 * sms, 16, v,
                v == kVAll ? std::vector<int>{kPdl, kNone} : std::vector<int>{kPdl});
  }
  CUDA_CHECK(cudaStreamDestroy(s));
  return 0;
}
