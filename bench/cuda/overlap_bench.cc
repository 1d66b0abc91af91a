// Can a decode step's attention (bandwidth-bound) run under its GEMMs (compute-bound) on one GPU?
// The measurement behind a NanoFlow-style two-micro-batch decode step, taken before building one.
// Two workloads of one decode step of the Llama-3.1-8B shape (32 layers) at batch B:
//   gemm: each layer's four linears (qkv, o_proj, gate_up, down) at B rows (cuBLAS), every layer
//         its own random weights (14 GB: they stream from HBM as in a real step);
//   attn: each layer's paged decode attention over B sequences of context C (random KV).
// Each runs alone, then both at once from two host threads on two backends (own streams): on the
// whole GPU (the block scheduler shares it), then with the SMs split between them by green
// contexts (attention on N SMs, the GEMMs on the rest, cuBLAS told their count). The closer
// "together" gets to the longer of the two alone (rather than their sum), the more a step that
// runs one micro-batch's attention beside the other's GEMMs could gain. (The whole step at once
// on two streams, without a split, gained 3-7%: bench/RESULTS.md.)
//
// Usage: strata_bench_overlap_bench [--batch B] [--context C] [--kv bf16|fp8_e4m3]
//   [--attn-sms N,N,...] [--reps R]
#include <cuda.h>

#include <chrono>
#include <cstdio>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "bench_args.h"
#include "core/check.h"

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

#define CU_CHECK(x)                                                       \
  do {                                                                    \
    const CUresult r_ = (x);                                              \
    CHECK_MSG(r_ == CUDA_SUCCESS, "{} failed: CUresult {}", #x, int(r_)); \
  } while (0)

struct Args {
  int batch = 280, context = 1536, reps = 5;
  std::string kv = "bf16";
  std::vector<int> attn_sms{16, 32, 48, 64};
};

// The 8B shape (configs/llama-3.1-8b).
constexpr int kHidden = 4096, kHeads = 32, kKvHeads = 8, kHeadDim = 128, kInter = 14336;
constexpr int kLayers = 32, kPage = 16;

LinearWeight random_linear(cuda::CudaBackend& be, int64_t out, int64_t in, uint64_t seed) {
  LinearWeight w;
  w.weight = be.alloc(DType::kBF16, {out, in});
  be.fill_random(*w.weight, seed, 0.02f);
  return w;
}

// One decode step's linears at B rows.
struct GemmWork {
  cuda::CudaBackend& be;
  std::vector<LinearWeight> qkv, o, gate_up, down;
  DeviceTensorPtr x, x_inter, y_qkv, y_gate_up, y;
  GemmWork(cuda::CudaBackend& backend, int B) : be(backend) {
    for (int l = 0; l < kLayers; ++l) {
      const uint64_t s = 1000 + 4 * uint64_t(l);
      qkv.push_back(random_linear(be, (kHeads + 2 * kKvHeads) * kHeadDim, kHidden, s));
      o.push_back(random_linear(be, kHidden, kHeads * kHeadDim, s + 1));
      gate_up.push_back(random_linear(be, 2 * kInter, kHidden, s + 2));
      down.push_back(random_linear(be, kHidden, kInter, s + 3));
    }
    x = be.alloc(DType::kBF16, {B, kHidden});
    x_inter = be.alloc(DType::kBF16, {B, kInter});
    y_qkv = be.alloc(DType::kBF16, {B, (kHeads + 2 * kKvHeads) * kHeadDim});
    y_gate_up = be.alloc(DType::kBF16, {B, 2 * kInter});
    y = be.alloc(DType::kBF16, {B, kHidden});
    be.fill_random(*x, 1, 1.0f);
    be.fill_random(*x_inter, 2, 1.0f);
  }
  void step() {
    for (int l = 0; l < kLayers; ++l) {
      be.linear(*x, qkv[size_t(l)], *y_qkv);
      be.linear(*x, o[size_t(l)], *y);
      be.linear(*x, gate_up[size_t(l)], *y_gate_up);
      be.linear(*x_inter, down[size_t(l)], *y);
    }
    be.synchronize();
  }
};

// One decode step's attention: B sequences of context C, pages in order, random KV.
struct AttnWork {
  cuda::CudaBackend& be;
  std::unique_ptr<KvStorage> kv;
  DeviceTensorPtr q, out;
  std::vector<int32_t> q_indptr{0}, kv_lens, page_indptr{0}, pages, pos, slots;
  AttentionMetadata meta;
  AttentionArgs args{.scale = 0.08838835f,
                     .num_heads = kHeads,
                     .num_kv_heads = kKvHeads,
                     .head_dim = kHeadDim,
                     .v_head_dim = kHeadDim};
  AttnWork(cuda::CudaBackend& backend, int B, int C, DType kv_dtype) : be(backend) {
    const int per_seq = (C + kPage - 1) / kPage;
    KvLayout lay;
    lay.num_layers = kLayers;
    lay.num_pages = int64_t(B) * per_seq;
    lay.page_size = kPage;
    lay.k_dim = lay.v_dim = kKvHeads * kHeadDim;
    lay.dtype = kv_dtype;
    kv = be.alloc_kv(lay);
    for (int l = 0; l < kLayers; ++l) {
      be.fill_random(kv->k(l), 100 + 2 * uint64_t(l), 0.5f);
      be.fill_random(kv->v(l), 101 + 2 * uint64_t(l), 0.5f);
    }
    pages.resize(size_t(B) * size_t(per_seq));
    std::iota(pages.begin(), pages.end(), 0);
    for (int s = 0; s < B; ++s) {
      q_indptr.push_back(s + 1);
      kv_lens.push_back(C);
      page_indptr.push_back((s + 1) * per_seq);
      pos.push_back(C - 1);
      slots.push_back((s * per_seq + (C - 1) / kPage) * kPage + (C - 1) % kPage);
    }
    meta = AttentionMetadata{.num_seqs = B,
                             .num_tokens = B,
                             .page_size = kPage,
                             .q_indptr = q_indptr.data(),
                             .kv_lens = kv_lens.data(),
                             .page_indptr = page_indptr.data(),
                             .page_indices = pages.data(),
                             .positions = pos.data(),
                             .slot_mapping = slots.data()};
    q = be.alloc(DType::kBF16, {B, kHeads * kHeadDim});
    out = be.alloc(DType::kBF16, {B, kHeads * kHeadDim});
    be.fill_random(*q, 3, 1.0f);
  }
  void step() {
    for (int l = 0; l < kLayers; ++l) be.paged_attention(*q, *kv, l, meta, args, *out);
    be.synchronize();
  }
};

// The device's SMs in two green contexts: `first` SMs (rounded up to the split granularity) and
// the rest, with one stream each.
struct SmSplit {
  CUgreenCtx ctx[2] = {};
  CUstream stream[2] = {};
  int sms[2] = {};
  explicit SmSplit(int first) {
    CUdevice dev;
    CU_CHECK(cuCtxGetDevice(&dev));
    CUdevResource all, group, rest;
    CU_CHECK(cuDeviceGetDevResource(dev, &all, CU_DEV_RESOURCE_TYPE_SM));
    unsigned int groups = 1;
    CU_CHECK(cuDevSmResourceSplitByCount(&group, &groups, &all, &rest, 0, unsigned(first)));
    CHECK_EQ(groups, 1u);
    CUdevResource* parts[2] = {&group, &rest};
    for (int i = 0; i < 2; ++i) {
      CUdevResourceDesc desc;
      CU_CHECK(cuDevResourceGenerateDesc(&desc, parts[i], 1));
      CU_CHECK(cuGreenCtxCreate(&ctx[i], desc, dev, CU_GREEN_CTX_DEFAULT_STREAM));
      CU_CHECK(cuGreenCtxStreamCreate(&stream[i], ctx[i], CU_STREAM_NON_BLOCKING, 0));
      sms[i] = int(parts[i]->sm.smCount);
    }
  }
  ~SmSplit() {
    for (int i = 0; i < 2; ++i) {
      cuStreamDestroy(stream[i]);
      cuGreenCtxDestroy(ctx[i]);
    }
  }
};

// Milliseconds per step of `a` and `b` run together from two threads, `reps` steps each.
template <typename A, typename B>
double together(A& a, B& b, int reps) {
  const auto t = Clock::now();
  std::thread other([&] {
    for (int r = 0; r < reps; ++r) b.step();
  });
  for (int r = 0; r < reps; ++r) a.step();
  other.join();
  return ms_since(t) / reps;
}

template <typename W>
double alone(W& w, int reps) {
  w.step();  // warm-up: cuBLAS heuristics, first allocations
  const auto t = Clock::now();
  for (int r = 0; r < reps; ++r) w.step();
  return ms_since(t) / reps;
}

void report(const char* how, double gemm, double attn, double both) {
  std::printf(
      "overlap  %-34s gemm alone %7.2f ms, attention alone %7.2f ms, serial %7.2f, together "
      "%7.2f ms (%.2fx of serial; the longer alone is %.2f)\n",
      how, gemm, attn, gemm + attn, both, (gemm + attn) / both, std::max(gemm, attn));
  std::fflush(stdout);
}

void run(const Args& a) {
  CU_CHECK(cuInit(0));
  auto gb = make_cuda_backend();
  auto ab = make_cuda_backend();
  auto& gemm_be = dynamic_cast<cuda::CudaBackend&>(*gb);
  auto& attn_be = dynamic_cast<cuda::CudaBackend&>(*ab);
  const DType kv = a.kv == "fp8_e4m3" ? DType::kFP8E4M3 : DType::kBF16;
  GemmWork gemm(gemm_be, a.batch);
  AttnWork attn(attn_be, a.batch, a.context, kv);
  std::printf("overlap  batch %d, context %d, KV %s, 8B shape, 32 layers per step, %d reps\n",
              a.batch, a.context, dtype_name(kv), a.reps);
  const double g = alone(gemm, a.reps), t = alone(attn, a.reps);
  report("whole GPU, no split:", g, t, together(gemm, attn, a.reps));
  for (const int n : a.attn_sms) {
    SmSplit split(n);
    attn_be.set_stream(reinterpret_cast<cudaStream_t>(split.stream[0]));
    gemm_be.set_stream(reinterpret_cast<cudaStream_t>(split.stream[1]), split.sms[1]);
    const double gs = alone(gemm, a.reps), ts = alone(attn, a.reps);
    char how[64];
    std::snprintf(how, sizeof how, "attention %d SMs, GEMMs %d SMs:", split.sms[0], split.sms[1]);
    report(how, gs, ts, together(gemm, attn, a.reps));
    attn_be.set_stream(nullptr);
    gemm_be.set_stream(nullptr);
  }
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) {
  using namespace strata;
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--batch")
      a.batch = std::stoi(v);
    else if (k == "--context")
      a.context = std::stoi(v);
    else if (k == "--kv")
      a.kv = v;
    else if (k == "--attn-sms")
      a.attn_sms = parse_int_list(v);
    else if (k == "--reps")
      a.reps = std::stoi(v);
    else {
      std::fprintf(stderr, "overlap_bench: unknown flag %s\n", k.c_str());
      return 2;
    }
  }
  if (argc % 2 == 0) {
    std::fprintf(stderr, "overlap_bench: flag %s has no value\n", argv[argc - 1]);
    return 2;
  }
  if (a.kv != "bf16" && a.kv != "fp8_e4m3") {
    std::fprintf(stderr, "overlap_bench: --kv must be bf16 or fp8_e4m3, got %s\n", a.kv.c_str());
    return 2;
  }
  run(a);
  return 0;
}
