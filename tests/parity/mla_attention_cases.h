// The MLA attention parity tests' shared pieces (mla_attention_parity_test.cc and
// mla_decode_parity_test.cc; what they check and the bounds: mla_attention_parity_test.cc's
// header): the row formats under test, one layer's cache written by the CPU's and the GPU's
// writers, and one attention case run on the GPU against the CPU twin (run_attention).
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/mla_attention.h"
#include "core/check.h"
#include "core/dtype.h"
#include "support/golden.h"
#include "tree_masks.h"

namespace strata::testing::mla_parity {

#define MLA_CUDA(expr)                                                            \
  do {                                                                            \
    const cudaError_t e_ = (expr);                                                \
    CHECK_MSG(e_ == cudaSuccess, "CUDA: {} ({})", cudaGetErrorString(e_), #expr); \
  } while (0)

// A device buffer freed on scope exit.
struct DevBuf {
  void* p = nullptr;
  size_t bytes = 0;
  explicit DevBuf(size_t n) : bytes(n) { MLA_CUDA(cudaMalloc(&p, std::max<size_t>(n, 16))); }
  ~DevBuf() { cudaFree(p); }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p);
  }
  template <typename T>
  static std::unique_ptr<DevBuf> of(const std::vector<T>& v) {
    auto b = std::make_unique<DevBuf>(v.size() * sizeof(T));
    MLA_CUDA(cudaMemcpy(b->p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
    return b;
  }
};

std::vector<uint16_t> to_bf16(const std::vector<float>& v);
int num_sms();
// The MLA kernels' shared-memory limits, set once a process.
void init_once();

// A row format under test: the tested layer's dtype, optional rope dtype, FlashMLA, scale.
struct Fmt {
  const char* name;
  DType dtype;
  std::optional<DType> rope_dtype;
  bool flashmla;
  float scale;
};
inline const Fmt kFormats[] = {
    {"bf16", DType::kBF16, std::nullopt, false, 1.0f},
    {"e4m3", DType::kFP8E4M3, std::nullopt, false, 1.0f},
    {"e4m3 scale 0.37", DType::kFP8E4M3, std::nullopt, false, 0.37f},
    {"e5m2 scale 2.5", DType::kFP8E5M2, std::nullopt, false, 2.5f},
    {"e4m3 + bf16 rope, scale 0.37", DType::kFP8E4M3, DType::kBF16, false, 0.37f},
    {"e5m2 + e4m3 rope, scale 1.7", DType::kFP8E5M2, DType::kFP8E4M3, false, 1.7f},
    {"e4m3 + f32 rope", DType::kFP8E4M3, DType::kF32, false, 1.0f},
    {"fp8_flashmla", DType::kFP8E4M3, std::nullopt, true, 1.0f},
};

// Layer 1 of a two-layer layout is the one tested (layer 0 stays bf16: per-layer dtypes).
KvLayout make_layout(const Fmt& f, int latent, int rope, int64_t pages, int page_size);

// One layer's cache on both sides, written by each side's writer from the same bf16 rows; the
// stored bytes compared.
struct Caches {
  std::unique_ptr<Backend> cpu = make_cpu_backend();
  std::unique_ptr<KvStorage> kc;
  std::unique_ptr<DevBuf> gpu;
  cuda::MlaRowFormat fmt{};
  KvLayout lay;
  int64_t mismatched_bytes = 0;

  Caches(const Fmt& f, int latent, int rope, int64_t pages, int page_size,
         const std::vector<float>& rows, const std::vector<int32_t>& slots);
};

// Rows of `width` values: N(0, sd) rounded to bf16, with extremes sprinkled in when `extremes`.
std::vector<float> random_rows(int64_t n, int width, float sd, std::mt19937& rng, bool extremes);

struct Case {
  int latent = 512, rope = 64;
  int heads = 16;
  int page = 16;
  std::vector<std::pair<int, int>> seqs;  // (cached, new) tokens
  int wgmma = 2;                          // 2: the pipelined wgmma kernel, 1: the wgmma kernel
  int splits = 0;                         // 0: the plan's
  int max_splits = 0;                     // the plan's splits capped (CudaTunables::mla_max_splits)
  int decode_rows = 0;                    // the decode kernel's rows a block (0: the plan's)
  bool graph = false;                     // also replay the launch from a captured graph
  int bf16_chunk = 48;                    // the mma kernel's chunk for bf16 rows (48 or 64)
  int decode = 1;                         // allow the decode kernel
  int cvt = -1;                           // the decode kernel's e4m3 conversion (-1: default)
  bool spread = false;                    // rows scaled by e^U(-7, 2): FlashMLA tile scales of
                                          // keys four orders of magnitude apart
  int l2_prefetch = -1;                   // the decode kernel's L2 prefetch distance (-1: default)
  int row_groups = 1;                     // the decode kernel: rows copied in groups of 4 (where
                                          // the page size is a multiple of 4), of 8 (2; where it
                                          // is a multiple of 8) or one by one (0)
  int stages = 0;                         // the decode kernel's stages (0: as many as fit)
  bool trees = false;   // sequences of 2..64 new tokens are draft trees (random parents):
                        // AttentionMetadata::tree_mask
  int fused_merge = 0;  // the decode kernel merges up to this many splits itself (MlaPlanOptions)
  int multicast = 1;    // the pipelined kernel's row-tile pairs where they apply (MlaPlanOptions)
  int s_groups = 0;     // 0: the plan's default S form; 2 / 3: the decode kernel's 16-row blocks
                        // with two S groups by rows / by dims (MlaPlanOptions), and the case then
                        // expects the plan to take them (3: where the rows go through the V tile,
                        // else 2) and the bits of one group (3: its output within an NMSE of 1e-5)
};

// Rows the decode kernel copies at once for a plan and page size (mla_decode_layout.cuh
// row_group_log2).
int decode_group_rows(const cuda::MlaPlan& plan, int page);
const char* kernel_name(const cuda::MlaPlan& plan);
using testing::nmse;  // support/golden.h
// One case: random rows into both sides' caches and random q; the GPU under the plan the case's
// options give, against the CPU twin (NMSE < 1e-4), the fused merge's counters left zero; with
// cs.s_groups the S forms against one group, with cs.graph a graph replay's bits.
void run_attention(const Fmt& f, const Case& cs);

}  // namespace strata::testing::mla_parity
