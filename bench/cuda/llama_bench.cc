// CUDA backend benchmarks on random bf16 weights of a real Llama shape (default Llama-3.1-8B):
//   ceilings   device-to-device copy bandwidth and the cuBLAS bf16 GEMM rate, measured here
//   gemv       the decode GEMV per 8B linear at batch 1 (launch variants), then at batch m = 1..64:
//              the tensor-core GEMV (bench/cuda/dev) vs FMA GEMV vs cuBLAS (bench_gemv_mma)
//   decode     batch-1 decode after a 512-token prompt through the real forward pass
//              (arch/llama.cc), eager and with CUDA graphs, against the weight-streaming limit
//   attention  the paged decode kernel at batch 64 × 4,096 context and causal prefill attention
//              of 8,192 tokens (compare with bench/cuda/sdpa_bench.py); 16/64/256-token chunks
//              over 4,096/32,768 cached tokens, regular kernels vs split-KV (attention-chunk:
//              those alone)
// The checkpoint is written as a sparse (zero) safetensors file, loaded through the normal
// loader, and every device allocation is then filled with random values: timings never see zeros.
//
// Usage: strata_bench_llama_bench [--config PATH] [--what ceilings,decode,attention]
//                                 [--steps N] [--prompt N] [--ncu-step 0|1]
//                                 [--int4-gemv-depth N] [--int4-gemv-blocks-per-sm N]
//                                 [--int4-gemv-ring N]
// --ncu-step 1: each decode mode ends with one eager step between cudaProfilerStart and
// cudaProfilerStop, for `ncu --profile-from-start off` (bench/cuda/decode_profile.sh).
// --int4-gemv-depth N, --int4-gemv-blocks-per-sm N, --int4-gemv-ring N: the CudaTunables of the
// INT4 register GEMV for the whole run (unset: their defaults).
#include <cublas_v2.h>
#include <cuda_profiler_api.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "arch/model.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/elementwise.h"
#include "bench_checkpoint.h"
#include "bench_timing.h"
#include "dev/dev_kernels.h"

namespace strata {
namespace {

using bench::Ceilings;
using bench::measure_ceilings;
using bench::time_ms;

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The decode GEMV (linear with one row) alone on the Llama-3.1-8B shapes, weights rotated over
// copies that together exceed the L2 cache. Returns the summed time of one token's GEMVs.
double bench_gemv(cuda::CudaBackend& be, const Ceilings& c, int max_ksplit, int64_t prefetch,
                  bool early, int warps) {
  be.tune([&](cuda::CudaTunables& t) {
    t.gemv_max_ksplit = max_ksplit;
    t.gemv_prefetch_elems = prefetch;
    t.gemv_block_warps = warps;
    t.pdl_early = early;
  });
  std::printf(
      "gemv     up to %d warps per output row, %d-warp blocks, L2 prefetch %lld elements "
      "per row before the PDL wait, early trigger %d:\n",
      max_ksplit, warps, (long long)prefetch, int(early));
  struct Shape2 {
    const char* name;
    int64_t n, k, per_token;
    bool glu;
  };
  double token_ms = 0;
  for (Shape2 s :
       {Shape2{"qkv", 6144, 4096, 32, false}, Shape2{"o_proj", 4096, 4096, 32, false},
        Shape2{"gate_up", 28672, 4096, 0, false}, Shape2{"gate_up+silu", 28672, 4096, 32, true},
        Shape2{"down", 4096, 14336, 32, false}, Shape2{"lm_head", 128256, 4096, 1, false}}) {
    const int copies = int(std::max<int64_t>(2, (int64_t(256) << 20) / (2 * s.n * s.k) + 1));
    std::vector<LinearWeight> w(static_cast<size_t>(copies));
    for (int i = 0; i < copies; ++i) {
      w[size_t(i)].weight = be.alloc(DType::kBF16, {s.n, s.k});
      be.fill_random(*w[size_t(i)].weight, 100 + uint64_t(i), 0.02f);
    }
    auto x = be.alloc(DType::kBF16, {1, s.k});
    auto out = be.alloc(DType::kBF16, {1, s.glu ? s.n / 2 : s.n});
    be.fill_random(*x, 99, 1.0f);
    const double ms = time_ms(be.stream(), 2, 10,
                              [&] {
                                for (auto& wi : w) {
                                  if (s.glu)
                                    be.linear_silu_mul(*x, wi, *out);
                                  else
                                    be.linear(*x, wi, *out);
                                }
                              }) /
                      copies;
    const double gbs = 2.0 * s.n * s.k / (ms * 1e-3) / 1e9;
    std::printf("gemv     %-8s %6lld x %5lld: %.1f us, %.0f GB/s = %.1f%% of copy bandwidth\n",
                s.name, (long long)s.n, (long long)s.k, ms * 1e3, gbs, 100.0 * gbs / c.copy_gbs);
    token_ms += ms * double(s.per_token);
  }
  std::printf("gemv     one decode token's GEMVs back to back: %.3f ms\n", token_ms);
  return token_ms;
}

// The decode linears of a batch of m sequences (m rows) on the Llama-3.1-8B shapes, each kernel
// launched directly: the tensor-core GEMV (bench/cuda/dev), the FMA GEMV (m <= 8) and cuBLAS
// (+ silu_mul for the GLU row); weights rotated over copies that together exceed the L2 cache.
// Then one decode step's linears (32 layers of qkv, o_proj, gate_up+silu, down, and lm_head)
// per kernel, the mma kernel's k-split target swept, and the fastest kernel per m.
void bench_gemv_mma(cuda::CudaBackend& be, const Ceilings& c) {
  struct Shape {
    const char* name;
    int64_t n, k;
    int per_step;  // launches in one decode step (32 layers)
    bool glu;
  };
  const Shape shapes[] = {
      {"qkv", 6144, 4096, 32, false},     {"o_proj", 4096, 4096, 32, false},
      {"gate_up", 28672, 4096, 0, false}, {"gate_up+silu", 28672, 4096, 32, true},
      {"down", 4096, 14336, 32, false},   {"lm_head", 128256, 4096, 1, false}};
  const int ms[] = {1, 2, 4, 8, 16, 32, 64};
  constexpr int kMs = 7;
  cublasHandle_t h;
  CHECK(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS);
  cublasSetStream(h, be.stream());
  // step[method][mi]: one decode step's linears (ms); method 0 mma, 1 FMA, 2 cuBLAS.
  double step[3][kMs] = {};
  const int per_sm0 = 24;  // the tensor-core GEMV's default k-split target
  const int sweep[] = {8, 16, 24, 48};
  double step_sweep[4][kMs] = {};
  double step_unroll[kMs] = {};
  std::printf(
      "gemvmma  batch-m decode linears, us and %% of copy bandwidth (weight bytes): tensor-core "
      "GEMV | FMA GEMV | cuBLAS (k-split target %d warps/SM)\n",
      per_sm0);
  for (const Shape& s : shapes) {
    const int copies = int(std::max<int64_t>(2, (int64_t(256) << 20) / (2 * s.n * s.k) + 1));
    std::vector<DeviceTensorPtr> w(static_cast<size_t>(copies));
    for (int i = 0; i < copies; ++i) {
      w[size_t(i)] = be.alloc(DType::kBF16, {s.n, s.k});
      be.fill_random(*w[size_t(i)], 200 + uint64_t(i), 0.02f);
    }
    auto x = be.alloc(DType::kBF16, {64, s.k});
    auto out = be.alloc(DType::kBF16, {64, s.n});
    auto tmp = be.alloc(DType::kBF16, {64, s.n});
    be.fill_random(*x, 98, 1.0f);
    const double gb = 2.0 * double(s.n) * double(s.k) / 1e9;
    for (int mi = 0; mi < kMs; ++mi) {
      const int m = ms[mi];
      cuda::GemvParams p{};
      p.x = x->view().ptr<cuda::bf16_bits>();
      p.bias = nullptr;
      p.out = out->view().ptr<cuda::bf16_bits>();
      p.m = m;
      p.n = s.n;
      p.k = s.k;
      p.glu_inter = s.glu ? s.n / 2 : 0;
      p.block_warps = be.tunables().gemv_block_warps;
      p.max_ksplit = be.tunables().gemv_max_ksplit;
      int per_sm = per_sm0, unroll8 = 4;  // the tensor-core GEMV's launch
      auto run = [&](int method) {
        return time_ms(be.stream(), 2, 10,
                       [&] {
                         for (auto& wi : w) {
                           p.w = wi->view().ptr<cuda::bf16_bits>();
                           if (method == 0) {
                             cuda::dev::gemv_mma(per_sm, unroll8)(p, be.launch());
                           } else if (method == 1) {
                             cuda::launch_gemv(p, be.launch());
                           } else {
                             const float alpha = 1, beta = 0;
                             void* o = s.glu ? tmp->view().data : out->view().data;
                             CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, int(s.n), m, int(s.k),
                                                &alpha, p.w, CUDA_R_16BF, int(s.k), p.x,
                                                CUDA_R_16BF, int(s.k), &beta, o, CUDA_R_16BF,
                                                int(s.n), CUBLAS_COMPUTE_32F,
                                                CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
                             if (s.glu) {
                               cuda::SiluMulParams sp{};
                               sp.x = tmp->view().ptr<cuda::bf16_bits>();
                               sp.out = out->view().ptr<cuda::bf16_bits>();
                               sp.rows = m;
                               sp.inter = s.n / 2;
                               cuda::launch_silu_mul(sp, be.launch());
                             }
                           }
                         }
                       }) /
               copies;
      };
      // The mma kernel's output against cuBLAS's for the last weight copy (a wrong kernel's
      // timings mean nothing).
      auto download = [&] {
        std::vector<uint16_t> h(size_t(m) * size_t(s.glu ? s.n / 2 : s.n));
        CUDA_CHECK(cudaStreamSynchronize(be.stream()));
        CUDA_CHECK(cudaMemcpy(h.data(), out->view().data, h.size() * 2, cudaMemcpyDeviceToHost));
        return h;
      };
      double t[3] = {run(0), 0.0, 0.0};
      const auto got = download();
      t[1] = m <= cuda::kGemvMaxRows ? run(1) : 0.0;
      t[2] = run(2);
      const auto want = download();
      double num = 0, den = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        const double d = double(bf16_to_f32(got[i])) - bf16_to_f32(want[i]);
        num += d * d;
        den += double(bf16_to_f32(want[i])) * bf16_to_f32(want[i]);
      }
      double ks_us[4] = {};
      for (int si = 0; si < 4; ++si) {
        per_sm = sweep[si];
        ks_us[si] = run(0) * 1e3;
        step_sweep[si][mi] += ks_us[si] * 1e-3 * s.per_step;
      }
      per_sm = per_sm0;
      char line[768];
      int len = std::snprintf(line, sizeof line, "gemvmma  %-12s %6lld x %5lld m=%-2d:", s.name,
                              (long long)s.n, (long long)s.k, m);
      const char* names[3] = {"mma", "fma", "cublas"};
      int best = 0;
      for (int j = 0; j < 3; ++j) {
        if (t[j] <= 0) {
          len +=
              std::snprintf(line + len, sizeof line - size_t(len), " %s      -      |", names[j]);
          continue;
        }
        if (t[j] < t[best] || t[best] <= 0) best = j;
        len += std::snprintf(line + len, sizeof line - size_t(len), " %s %7.1f us %5.1f%% |",
                             names[j], t[j] * 1e3, 100.0 * gb / (t[j] * 1e-3) / c.copy_gbs);
        step[j][mi] += t[j] * s.per_step;
      }
      std::printf(
          "%s fastest %s; mma nmse vs cublas %.1e; mma at k-split target %d/%d/%d/%d: "
          "%.1f/%.1f/%.1f/%.1f us\n",
          line, names[best], den > 0 ? num / den : num, sweep[0], sweep[1], sweep[2], sweep[3],
          ks_us[0], ks_us[1], ks_us[2], ks_us[3]);
      if (m > 32) {  // the 8-n-tile kernels with half the weight loads in flight
        const int u0 = unroll8;
        unroll8 = u0 == 4 ? 2 : 4;
        const double t2 = run(0);
        step_unroll[mi] += t2 * s.per_step;
        std::printf(
            "gemvmma  %-12s %6lld x %5lld m=%-2d: mma with %d chunks per weight batch (not %d): "
            "%.1f us\n",
            s.name, (long long)s.n, (long long)s.k, m, unroll8, u0, t2 * 1e3);
        unroll8 = u0;
      }
    }
  }
  cublasDestroy(h);
  for (int mi = 0; mi < kMs; ++mi) {
    std::printf("gemvmma  decode step's linears (32 layers + lm_head) at m=%-2d: mma %.3f ms, ",
                ms[mi], step[0][mi]);
    if (ms[mi] <= cuda::kGemvMaxRows)
      std::printf("fma %.3f ms, ", step[1][mi]);
    else
      std::printf("fma -, ");
    std::printf("cublas %.3f ms; mma k-split target", step[2][mi]);
    for (int si = 0; si < 4; ++si) std::printf(" %d: %.3f", sweep[si], step_sweep[si][mi]);
    if (ms[mi] > 32) std::printf("; mma, other unroll: %.3f", step_unroll[mi]);
    std::printf(" ms\n");
  }
}

// One sequence through the model: prefill then decode steps, pages in order.
class Runner {
 public:
  Runner(Model& m, int capacity, int page_size) : m_(m), page_size_(page_size) {
    KvLayout layout = m.kv_layout();
    layout.page_size = page_size;
    layout.num_pages = (capacity + page_size - 1) / page_size;
    layout.dtype = DType::kBF16;
    kv_ = m.backend().alloc_kv(layout);
    pages_.resize(size_t(layout.num_pages));
    std::iota(pages_.begin(), pages_.end(), 0);
    logits_.resize(size_t(m.spec().vocab_size));
  }
  // Appends `ids`; returns the argmax of the last position's logits.
  int32_t step(const std::vector<int32_t>& ids) {
    const int n = int(ids.size());
    const int32_t start = len_;
    len_ += n;
    std::vector<int32_t> pos(static_cast<size_t>(n)), slots(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
      pos[size_t(i)] = start + i;
      slots[size_t(i)] =
          pages_[size_t((start + i) / page_size_)] * page_size_ + (start + i) % page_size_;
    }
    int32_t q_indptr[2] = {0, n}, kv_lens[1] = {len_};
    int32_t page_indptr[2] = {0, (len_ + page_size_ - 1) / page_size_}, rows[1] = {n - 1};
    ForwardBatch b;
    b.token_ids = ids.data();
    b.attn = AttentionMetadata{.num_seqs = 1,
                               .num_tokens = n,
                               .page_size = page_size_,
                               .q_indptr = q_indptr,
                               .kv_lens = kv_lens,
                               .page_indptr = page_indptr,
                               .page_indices = pages_.data(),
                               .positions = pos.data(),
                               .slot_mapping = slots.data()};
    b.logit_rows = rows;
    b.num_logit_rows = 1;
    if (gpu_sample_) {  // greedy on the device (Backend::sample): only the id comes back
      SampleRowParams greedy;
      int32_t id = 0;
      m_.forward_sample(b, *kv_, SampleArgs{.params = &greedy, .token_ids = &id});
      return id;
    }
    m_.forward(b, *kv_, logits_.data());
    return int32_t(std::max_element(logits_.begin(), logits_.end()) - logits_.begin());
  }
  void set_gpu_sample(bool on) { gpu_sample_ = on; }
  int len() const { return len_; }

 private:
  Model& m_;
  int page_size_;
  int32_t len_ = 0;
  bool gpu_sample_ = false;
  std::vector<int32_t> pages_;
  std::vector<float> logits_;
  std::unique_ptr<KvStorage> kv_;
};

void bench_decode(cuda::CudaBackend& be, const std::string& config, const Ceilings& c, int prompt,
                  int steps, bool ncu_step) {
  const std::string dir = "/tmp/strata_bench_llama";
  auto t0 = Clock::now();
  const int64_t ckpt_bytes = write_zero_checkpoint(config, dir);
  auto m = load_model(dir, be);
  CHECK_MSG(m.ok(), "{}", m.status().to_string());
  be.fill_all_random(42, 0.02f);
  const ModelSpec& s = (*m)->spec();
  std::printf(
      "model    %s: %d layers, hidden %lld, %.2f GB of weights (stored format), loaded in %.1f s\n",
      config.c_str(), s.num_layers, (long long)s.hidden_size, double(ckpt_bytes) / 1e9,
      seconds_since(t0));
  // Bytes one decode token must stream: every weight but the embedding table (one row), plus
  // the KV cache read by attention.
  const int64_t embed_bytes = 2 * s.vocab_size * s.hidden_size;
  const int64_t weight_bytes = ckpt_bytes - (s.tie_word_embeddings ? 0 : embed_bytes);
  const int64_t kv_per_token = 2 * int64_t(s.num_kv_heads) * s.head_dim * 2 * s.num_layers;
  std::mt19937 rng(3);
  std::uniform_int_distribution<int32_t> tok(0, int32_t(s.vocab_size - 1));
  // Launch variants (A/B in one process): graphs, PDL, the fused ops, early PDL triggers, the
  // GEMV's L2 prefetch before its wait (elements per row), GEMV block warps, and greedy sampling
  // on the device instead of downloading the logits.
  struct Mode {
    const char* name;
    bool graphs, pdl, fusion, early;
    int64_t prefetch;
    int warps;
    bool gpu_sample;
    int attn_per_sm;  // decode attention's split-KV target (blocks per SM); 0: the backend's
                      // default
  };
  // 0-5 run by default (the defaults first: fused ops, no early trigger, no prefetch); the rest
  // are the launch tunables measured on 2026-11-29 night (all slower; DECODE_MODES=all runs them).
  const Mode modes[] = {
      {"eager, old path", false, true, false, false, 0, 8, false, 0},
      {"graphs, no PDL, old path", true, false, false, false, 0, 8, false, 0},
      {"graphs+PDL, old path (before 2026-11-29 night)", true, true, false, false, 0, 8, false, 0},
      {"graphs+PDL, fused ops (defaults), host argmax", true, true, true, false, 0, 8, false, 0},
      {"graphs+PDL, fused ops (defaults), GPU greedy (the engine's path)", true, true, true, false,
       0, 8, true, 0},
      {"graphs+PDL, old path, GPU greedy", true, true, false, false, 0, 8, true, 0},
      {"graphs+PDL, fused, early trigger", true, true, true, true, 0, 8, false, 0},
      {"graphs+PDL, fused, early, prefetch 2K", true, true, true, true, 2048, 8, false, 0},
      {"graphs+PDL, fused, early, prefetch 4K", true, true, true, true, 4096, 8, false, 0},
      {"graphs+PDL, fused, early, prefetch 8K", true, true, true, true, 8192, 8, false, 0},
      {"graphs+PDL, fused, early, prefetch 16K", true, true, true, true, 16384, 8, false, 0},
      {"graphs+PDL, fused, no early, prefetch 4K", true, true, true, false, 4096, 8, false, 0},
      {"graphs+PDL, fused, early, prefetch 4K, 4-warp GEMV", true, true, true, true, 4096, 4, false,
       0},
      {"graphs+PDL, fused, early, prefetch 4K, GPU greedy", true, true, true, true, 4096, 8, true,
       0},
      {"eager+PDL, fused, early, prefetch 4K", false, true, true, true, 4096, 8, false, 0},
      {"graphs+PDL, fused, early, prefetch 4K, attention split target 1/SM", true, true, true, true,
       4096, 8, false, 1},
      {"graphs+PDL, fused, early, prefetch 4K, attention split target 8/SM", true, true, true, true,
       4096, 8, false, 8},
      {"graphs+PDL, fused, early, prefetch 16K, 4-warp GEMV", true, true, true, true, 16384, 4,
       false, 0},
      {"graphs+PDL, fused, early, prefetch 16K, 4-warp, GPU greedy", true, true, true, true, 16384,
       4, true, 0},
  };
  // DECODE_MODES: "all", or indices into modes ("3,4"); unset: 0-5.
  const char* env_modes = std::getenv("DECODE_MODES");
  const std::string only = env_modes != nullptr ? env_modes : "0,1,2,3,4,5";
  const cuda::CudaTunables tunables0 = be.tunables();
  for (int mi = 0; mi < int(sizeof modes / sizeof modes[0]); ++mi) {
    const Mode& mode = modes[mi];
    if (only != "all" &&
        ("," + only + ",").find("," + std::to_string(mi) + ",") == std::string::npos)
      continue;
    const bool graphs = mode.graphs;
    be.tune([&](cuda::CudaTunables& t) {
      t.pdl = mode.pdl;
      t.fusion = mode.fusion;
      t.pdl_early = mode.early;
      t.gemv_prefetch_elems = mode.prefetch;
      t.gemv_block_warps = mode.warps;
      if (mode.attn_per_sm > 0) t.decode_blocks_per_sm = mode.attn_per_sm;
    });
    be.set_graph_mode(graphs);
    Runner r(**m, prompt + steps + 16, 16);
    r.set_gpu_sample(mode.gpu_sample);
    std::vector<int32_t> ids(static_cast<size_t>(prompt));
    for (auto& x : ids) x = tok(rng);
    auto tp = Clock::now();
    int32_t next = r.step(ids);
    const double prefill_s = seconds_since(tp);
    for (int i = 0; i < 8; ++i) next = r.step({next});  // warm-up (graph capture)
    const cuda::GraphStats before = be.graph_stats();
    auto td = Clock::now();
    for (int i = 0; i < steps; ++i) next = r.step({next});
    const double per_token_s = seconds_since(td) / steps;
    const cuda::GraphStats& after = be.graph_stats();
    const int64_t rec_steps = after.recorded_steps - before.recorded_steps;
    const double record_us =
        rec_steps > 0 ? 1e-3 * double(after.record_ns - before.record_ns) / double(rec_steps) : 0.0;
    const double flush_us =
        rec_steps > 0 ? 1e-3 * double(after.flush_ns - before.flush_ns) / double(rec_steps) : 0.0;
    const double bytes = double(weight_bytes) + double(kv_per_token) * (prompt + 8 + steps / 2);
    const double limit_s = bytes / (c.copy_gbs * 1e9);
    std::printf(
        "decode   [%d] %s: batch 1, prompt %d: %.3f ms/token = %.1f tok/s; %.2f GB/token -> "
        "%.0f GB/s = %.1f%% of the copy-bandwidth limit (%.1f tok/s); host record %.0f us/step "
        "(flush %.0f us); prefill %d tokens %.1f ms\n",
        mi, mode.name, prompt, per_token_s * 1e3, 1.0 / per_token_s, bytes / 1e9,
        bytes / per_token_s / 1e9, 100.0 * limit_s / per_token_s, 1.0 / limit_s, record_us,
        flush_us, prompt, prefill_s * 1e3);
    if (ncu_step) {
      be.set_graph_mode(false);
      be.synchronize();
      CUDA_CHECK(cudaProfilerStart());
      next = r.step({next});
      be.synchronize();
      CUDA_CHECK(cudaProfilerStop());
    }
  }
  be.set_tunables(tunables0);
  const auto& st = be.graph_stats();
  std::printf("graphs   captures %lld, replays %lld\n", (long long)st.captures,
              (long long)st.replays);
  be.set_graph_mode(false);
}

// Device time per op kind of one decode step (eager, events around every launch).
void bench_profile(cuda::CudaBackend& be, const std::string& config, int prompt, int steps) {
  const std::string dir = "/tmp/strata_bench_profile";
  write_zero_checkpoint(config, dir);
  auto m = load_model(dir, be);
  CHECK_MSG(m.ok(), "{}", m.status().to_string());
  be.fill_all_random(43, 0.02f);
  for (bool fused : {false, true}) {
    be.tune([&](cuda::CudaTunables& t) { t.fusion = fused; });
    Runner r(**m, prompt + steps + 16, 16);
    std::vector<int32_t> ids(static_cast<size_t>(prompt), 7);
    int32_t next = r.step(ids);
    for (int i = 0; i < 4; ++i) next = r.step({next});
    be.set_profile(true);
    for (int i = 0; i < steps; ++i) next = r.step({next});
    std::printf("profile  %s (%d layers), decode batch 1 after %d tokens, %s:\n%s", config.c_str(),
                (*m)->spec().num_layers, prompt, fused ? "fused ops" : "unfused (old path)",
                be.profile_report(steps).c_str());
    be.set_profile(false);
  }
  be.tune([](cuda::CudaTunables& t) { t.fusion = true; });
}

// Paged attention alone: random KV, pages scrambled.
double bench_attention(cuda::CudaBackend& be, const Ceilings& c, int seqs, int ctx, int fresh,
                       int heads, int kv_heads, int hd, DType kv_dtype = DType::kBF16,
                       int reps = 20) {
  const int page = 16;
  const int pages_per_seq = (ctx + page - 1) / page;
  const int64_t num_pages = int64_t(seqs) * pages_per_seq;
  KvLayout lay{.num_layers = 1,
               .num_pages = num_pages,
               .page_size = page,
               .k_dim = kv_heads * hd,
               .v_dim = kv_heads * hd,
               .dtype = kv_dtype};
  auto kv = be.alloc_kv(lay);
  // Random bytes: as bf16, values in [-1, 1]; as fp8, values of every binade (e4m3 has no
  // infinities; its NaN codes are 2 of 256, harmless to a timing).
  be.fill_random(kv->k(0), 11, 1.0f);
  be.fill_random(kv->v(0), 12, 1.0f);
  std::vector<int32_t> perm(static_cast<size_t>(num_pages));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(5));
  std::vector<int32_t> q_indptr{0}, kv_lens, page_indptr{0}, pos, slots;
  for (int s = 0; s < seqs; ++s) {
    q_indptr.push_back(q_indptr.back() + fresh);
    kv_lens.push_back(ctx);
    page_indptr.push_back((s + 1) * pages_per_seq);
    for (int j = ctx - fresh; j < ctx; ++j) {
      pos.push_back(j);
      slots.push_back(perm[size_t(s * pages_per_seq + j / page)] * page + j % page);
    }
  }
  const int t = q_indptr.back();
  AttentionMetadata meta{.num_seqs = seqs,
                         .num_tokens = t,
                         .page_size = page,
                         .q_indptr = q_indptr.data(),
                         .kv_lens = kv_lens.data(),
                         .page_indptr = page_indptr.data(),
                         .page_indices = perm.data(),
                         .positions = pos.data(),
                         .slot_mapping = slots.data()};
  auto q = be.alloc(DType::kBF16, {t, heads, hd}), out = be.alloc(DType::kBF16, {t, heads, hd});
  be.fill_random(*q, 13, 1.0f);
  AttentionArgs args{.scale = float(1.0 / std::sqrt(double(hd))),
                     .num_heads = heads,
                     .num_kv_heads = kv_heads,
                     .head_dim = hd,
                     .v_head_dim = hd};
  // Several launches per timed region, so the host's per-call work (tile list, staging) overlaps
  // the device's and only the kernels are timed; `reps` regions, median. ATTN_CALLS=1 times
  // one call per region, host work included (how the numbers before 2026-11-29 evening were taken).
  const char* calls_env = std::getenv("ATTN_CALLS");
  const int kCalls = calls_env != nullptr ? std::max(1, std::atoi(calls_env)) : 4;
  const double ms = time_ms(be.stream(), reps > 2 ? 2 : 1, reps,
                            [&] {
                              for (int i = 0; i < kCalls; ++i)
                                be.paged_attention(*q, *kv, 0, meta, args, *out);
                            }) /
                    kCalls;
  if (fresh == 1) {
    const double bytes = double(seqs) * ctx * lay.k_dim * 2 * dtype_size(kv_dtype);
    std::printf(
        "attn     decode %d seqs x %d ctx (%d/%d heads, hd %d, page %d, KV %s): %.3f ms, "
        "%.0f GB/s of KV = %.1f%% of copy bandwidth\n",
        seqs, ctx, heads, kv_heads, hd, page, dtype_name(kv_dtype), ms, bytes / (ms * 1e-3) / 1e9,
        100.0 * bytes / (ms * 1e-3) / 1e9 / c.copy_gbs);
  } else {
    // Causal FLOPs of QKᵀ and PV: ctx² / 2 key visits for a whole prompt (as sdpa_bench.py
    // counts); a chunk of `fresh` new tokens after ctx - fresh cached ones visits Σ (p + 1).
    const double visits =
        fresh == ctx ? double(ctx) * ctx / 2 : double(fresh) * (2.0 * ctx - fresh + 1) / 2;
    const double flops = 4.0 * heads * hd * visits * seqs;
    const double tflops = flops / (ms * 1e-3) / 1e12;
    std::printf(
        "attn     prefill causal %d x %d new of %d tokens (%d/%d heads, hd %d, page %d, KV %s): "
        "%.3f ms, %.0f TFLOP/s (causal FLOPs) = %.1f%% of the GEMM rate",
        seqs, fresh, ctx, heads, kv_heads, hd, page, dtype_name(kv_dtype), ms, tflops,
        100.0 * tflops / c.gemm_tflops);
    if (fresh < ctx) {  // a chunk over cached tokens: the KV cache read once is the floor
      const double bytes = double(seqs) * ctx * lay.k_dim * 2 * dtype_size(kv_dtype);
      std::printf("; KV %.0f GB/s = %.1f%% of copy bandwidth", bytes / (ms * 1e-3) / 1e9,
                  100.0 * bytes / (ms * 1e-3) / 1e9 / c.copy_gbs);
    }
    std::printf("\n");
  }
  return ms;
}

// Short query chunks over long cached contexts (prefix-cache and host-tier hits, the last chunk
// of chunked prefill): the regular prefill kernels (split mode 0) against split-KV (forced: auto
// mode takes it for all of these cases but 256 tokens over fp8 KV, where it lost).
void bench_chunk_attention(cuda::CudaBackend& be, const Ceilings& c) {
  const cuda::CudaTunables tunables0 = be.tunables();
  auto split = [&](int mode, int per_sm) {
    be.tune([&](cuda::CudaTunables& t) {
      t.prefill_split_mode = mode;
      t.prefill_split_blocks_per_sm = per_sm;
    });
  };
  struct Case {
    int fresh, ctx;
    DType kv;
  };
  std::vector<std::string> summary;
  for (Case k : {Case{16, 32768, DType::kBF16}, Case{64, 32768, DType::kBF16},
                 Case{256, 32768, DType::kBF16}, Case{16, 4096, DType::kBF16},
                 Case{64, 4096, DType::kBF16}, Case{256, 4096, DType::kBF16},
                 Case{16, 32768, DType::kFP8E4M3}, Case{256, 32768, DType::kFP8E4M3}}) {
    split(0, 2);
    std::printf("attn     chunk: regular prefill kernels\n");
    const double before = bench_attention(be, c, 1, k.ctx, k.fresh, 32, 8, 128, k.kv);
    double best = 1e30;
    int best_per_sm = 0;
    for (int per_sm : {1, 2, 4}) {
      split(2, per_sm);
      std::printf("attn     chunk: split-KV, %d blocks per SM\n", per_sm);
      const double ms = bench_attention(be, c, 1, k.ctx, k.fresh, 32, 8, 128, k.kv);
      if (ms < best) best = ms, best_per_sm = per_sm;
    }
    split(2, 2);
    const double ms2 = bench_attention(be, c, 1, k.ctx, k.fresh, 32, 8, 128, k.kv);
    const double gbs = double(k.ctx) * 8 * 128 * 2 * dtype_size(k.kv) / (ms2 * 1e-3) / 1e9;
    char line[256];
    std::snprintf(line, sizeof line,
                  "chunk    %3d new over %5d (KV %s): regular %.3f ms -> split %.3f ms (%.1fx), "
                  "KV %.0f GB/s = %.0f%% of copy; best %.3f ms at %d blocks/SM",
                  k.fresh, k.ctx, dtype_name(k.kv), before, ms2, before / ms2, gbs,
                  100.0 * gbs / c.copy_gbs, best, best_per_sm);
    summary.push_back(line);
  }
  be.set_tunables(tunables0);
  for (const auto& l : summary) std::printf("%s\n", l.c_str());
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) {
  using namespace strata;
  std::string config = std::string(STRATA_SHARED_DIR) + "/configs/llama-3.1-8b/config.json";
  std::string what = "ceilings,gemv,attention,decode";
  // -1: the backend's default
  int steps = 128, prompt = 512, int4_gemv_depth = -1, int4_blocks = -1, int4_ring = -1;
  bool ncu_step = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--config")
      config = argv[i + 1];
    else if (a == "--what")
      what = argv[i + 1];
    else if (a == "--steps")
      steps = std::atoi(argv[i + 1]);
    else if (a == "--prompt")
      prompt = std::atoi(argv[i + 1]);
    else if (a == "--ncu-step")
      ncu_step = std::string(argv[i + 1]) == "1";
    else if (a == "--int4-gemv-depth")
      int4_gemv_depth = std::atoi(argv[i + 1]);
    else if (a == "--int4-gemv-blocks-per-sm")
      int4_blocks = std::atoi(argv[i + 1]);
    else if (a == "--int4-gemv-ring")
      int4_ring = std::atoi(argv[i + 1]);
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // lines survive a crash (logs are files)
  auto backend = make_cuda_backend();
  auto& be = dynamic_cast<cuda::CudaBackend&>(*backend);
  if (int4_gemv_depth >= 0)
    be.tune([&](cuda::CudaTunables& t) { t.int4_gemv_depth = int4_gemv_depth; });
  if (int4_blocks >= 0)
    be.tune([&](cuda::CudaTunables& t) { t.int4_gemv_blocks_per_sm = int4_blocks; });
  if (int4_ring >= 0) be.tune([&](cuda::CudaTunables& t) { t.int4_gemv_ring = int4_ring; });
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device   %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  if (what == "attention-ncu") {  // one of each attention kernel, for a profiler run
    const Ceilings none{.copy_gbs = 1, .gemm_tflops = 1};
    bench_attention(be, none, 64, 4096, 1, 32, 8, 128, DType::kBF16, 2);
    for (auto v : {cuda::dev::PrefillVariant::kWgmma128, cuda::dev::PrefillVariant::kWgmma128S3,
                   cuda::dev::PrefillVariant::kMma}) {
      be.set_dev_kernels(cuda::dev::prefill_variant_kernels(v));
      bench_attention(be, none, 1, 8192, 8192, 32, 8, 128, DType::kBF16, 2);
    }
    return 0;
  }
  const Ceilings c = measure_ceilings(be.stream());
  if (what == "attention-decode") {  // the decode kernel alone (ATTN_CALLS comparisons)
    be.tune([](cuda::CudaTunables& t) { t.decode_blocks_per_sm = 2; });
    bench_attention(be, c, 64, 4096, 1, 32, 8, 128);
    bench_attention(be, c, 64, 4096, 1, 32, 8, 128, DType::kFP8E4M3);
    bench_attention(be, c, 64, 4096, 1, 32, 8, 128, DType::kFP8E5M2);
    // The offline benchmark's decode steps: 1,000 rows over fp8 KV, ~560 over bf16.
    bench_attention(be, c, 1000, 1536, 1, 32, 8, 128, DType::kFP8E4M3);
    bench_attention(be, c, 560, 1536, 1, 32, 8, 128);
    return 0;
  }
  if (what == "attention-chunk") {  // the split-KV prefill cases alone
    bench_chunk_attention(be, c);
    return 0;
  }
  if (what.find("attention") != std::string::npos) {
    const cuda::CudaTunables tunables0 = be.tunables();
    for (int per_sm : {2, 4, 8}) {
      be.tune([&](cuda::CudaTunables& t) { t.decode_blocks_per_sm = per_sm; });
      std::printf("attn     split-KV target %d blocks per SM:\n", per_sm);
      bench_attention(be, c, 64, 4096, 1, 32, 8, 128);
      bench_attention(be, c, 64, 4096, 1, 32, 8, 128, DType::kFP8E4M3);
    }
    be.set_tunables(tunables0);
    // The product's kernel (wgmma64s3 for bf16 KV at head_dim 64, wgmma64 otherwise), then
    // every development variant.
    for (int vi = -1; vi < int(std::size(cuda::dev::kPrefillVariants)); ++vi) {
      if (vi < 0) {
        be.set_dev_kernels({});
        std::printf("attn     prefill kernel: the product's\n");
      } else {
        const cuda::dev::PrefillVariant v = cuda::dev::kPrefillVariants[vi];
        be.set_dev_kernels(cuda::dev::prefill_variant_kernels(v));
        std::printf("attn     prefill kernel %s:\n", cuda::dev::prefill_variant_name(v));
      }
      bench_attention(be, c, 1, 8192, 8192, 32, 8, 128);
      bench_attention(be, c, 1, 8192, 8192, 32, 8, 128, DType::kFP8E4M3);
      // Other shapes: MHA (group 1), group 8, head_dim 64, a batch of 1,024-token chunks.
      bench_attention(be, c, 1, 8192, 8192, 32, 32, 128);
      bench_attention(be, c, 1, 8192, 8192, 64, 8, 128);
      bench_attention(be, c, 1, 8192, 8192, 32, 8, 64);
      bench_attention(be, c, 8, 8192, 1024, 32, 8, 128);
    }
    be.set_dev_kernels({});
    bench_chunk_attention(be, c);
  }
  if (what.find("gemv") != std::string::npos) {
    const cuda::CudaTunables tunables0 = be.tunables();
    bench_gemv(be, c, 1, 0, false, 8);    // one warp per row (the default until 2026-11-29 night)
    bench_gemv(be, c, 4, 0, false, 8);    // the defaults: 2 warps per row for qkv, o_proj, down
    bench_gemv(be, c, 1, 4096, true, 8);  // measured slower on 2026-11-29 night
    be.set_tunables(tunables0);
    bench_gemv_mma(be, c);
  }
  if (what.find("profile") != std::string::npos) bench_profile(be, config, prompt, steps);
  if (what.find("decode") != std::string::npos)
    bench_decode(be, config, c, prompt, steps, ncu_step);
  return 0;
}
