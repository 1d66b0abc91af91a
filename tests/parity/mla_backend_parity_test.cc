// MLA through the CUDA backend's own entry points (issue 22): CudaBackend::kv_write of latent rows
// and CudaBackend::mla_attention against the CPU backend's, on KV storages each backend allocated
// from one KvLayout, over the step's own metadata (what the models run; the kernels themselves
// are tested on raw buffers in mla_attention_parity_test.cc).
//
// What must hold and the bounds:
//  - every KV layout the CPU has (bf16 rows; fp8 e4m3 / e5m2 with non-unit per-layer scales; fp8
//    latents with a bf16, fp8 or f32 rope part; FlashMLA rows; and a model's own layout without
//    its rope split, rope_dim 0, as tests and tools allocate it) stores the CPU's bytes in every
//    written slot (both sides encode the same bf16 values: backend/kv_format.cc);
//  - attention over those caches: NMSE against the CPU < 1e-4, the kernels' bound (same stored
//    values; the GPU rounds P and its output to bf16), for decode (one new token each of four
//    sequences of 1-1,000 keys: split-KV with empty splits) and prefill (37-64 new tokens over
//    0-130 cached ones, causal among them, page size 3), at the tiny fixtures' (32 + 8, 4 heads),
//    house-mla's (128 + 32, 5 heads) and the real models' (512 + 64, 16 heads) dims;
//  - no call of these dims runs on the CPU twin (cpu_fallback_counts' mla_attention stays 0);
//    dims the kernels are not built for do, counted, with the same bound;
//  - decode steps recorded in graph mode replay their captured graph while contexts grow, with
//    the same bound at every step.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "parity/mla_sequences.h"
#include "parity/op_pair.h"

namespace strata::testing {
namespace {

using parity::Pair;

// Sequences on both backends: layer 1 of mla_test_layout,
// each sequence's pages (for `capacity` tokens) scrambled over the pool.
class MlaBatch {
 public:
  MlaBatch(Pair& p, const MlaFormat& f, const MlaDims& d, int page,
           const std::vector<int>& capacity)
      : p_(p), f_(f), d_(d), seqs_(p.rng(), page, capacity) {
    lay_ = mla_test_layout(f, d, page, seqs_.num_pages());
    const Status st = p.gpu_->check_kv_layout(lay_);
    EXPECT_TRUE(st.ok()) << f.name << ": " << st.message();
    cpu_ = p.cpu_->alloc_kv(lay_);
    gpu_ = p.gpu_->alloc_kv(lay_);
    cpu_->set_scales(1, f.scale, 1.0f);
    gpu_->set_scales(1, f.scale, 1.0f);
  }

  // Appends fresh[s] tokens to sequence s on both sides (random rows of the format's scale);
  // with `attend`, then attention of the new tokens, returning its NMSE against the CPU.
  double step(const std::vector<int>& fresh, bool attend) {
    const int width = d_.latent + d_.rope, heads = d_.heads;
    const AttentionMetadata& meta = seqs_.grow(fresh);
    written_.insert(written_.end(), seqs_.slots().begin(), seqs_.slots().end());
    const int t = meta.num_tokens;
    // Every upload first: an upload ends the backend's step, and a graph step should hold the
    // write and the attention.
    auto rows = p_.make(p_.random(int64_t(t) * width, f_.scale), {t, width});
    auto q = p_.make(p_.random(int64_t(t) * heads * width, 1.0f / f_.scale), {t, heads, width});
    auto out = p_.out({t, heads, d_.latent});
    p_.cpu_->kv_write(*cpu_, 1, *rows.cpu, Tensor(), meta);
    p_.gpu_->kv_write(*gpu_, 1, *rows.gpu, Tensor(), meta);
    if (!attend) return 0;
    const MlaArgs args{.scale = float(1.0 / std::sqrt(192.0)),
                       .num_heads = heads,
                       .kv_lora_rank = d_.latent,
                       .rope_dim = d_.rope};
    p_.cpu_->mla_attention(*q.cpu, *cpu_, 1, meta, args, *out.cpu);
    p_.gpu_->mla_attention(*q.gpu, *gpu_, 1, meta, args, *out.gpu);
    return p_.nmse(out);
  }

  // Written slots whose stored row differs between the backends.
  int64_t rows_differing() {
    p_.gpu_->synchronize();
    const Tensor g = gpu_->k(1), c = cpu_->k(1);
    EXPECT_EQ(g.nbytes(), c.nbytes());
    std::vector<char> host(size_t(g.nbytes()));
    EXPECT_EQ(cudaMemcpy(host.data(), g.data, host.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    const int64_t row = lay_.k_row_bytes(1);
    int64_t differ = 0;
    for (int32_t slot : written_)
      differ += std::memcmp(host.data() + slot * row, static_cast<const char*>(c.data) + slot * row,
                            size_t(row)) != 0;
    return differ;
  }

 private:
  Pair& p_;
  const MlaFormat& f_;
  const MlaDims d_;
  GrowingSequences seqs_;
  KvLayout lay_;
  std::unique_ptr<KvStorage> cpu_, gpu_;
  std::vector<int32_t> written_;  // every slot written
};

void report(const char* what, const MlaFormat& f, const MlaDims& d, double e) {
  std::printf("mla backend %-8s %-30s %3d+%-2d heads %2d: nmse %.3g\n", what, f.name, d.latent,
              d.rope, d.heads, e);
}

TEST(MlaBackend, DecodeAndPrefillEveryLayout) {
  Pair p;
  for (const MlaDims& d : kMlaDims) {
    for (const MlaFormat& f : kMlaFormats) {
      SCOPED_TRACE(std::string(f.name) + " " + std::to_string(d.latent) + "+" +
                   std::to_string(d.rope));
      {  // decode: one new token each, contexts 1 to 1,000 (split-KV, empty splits)
        MlaBatch b(p, f, d, 16, {1, 18, 301, 1001});
        b.step({0, 17, 300, 1000}, false);
        const double e = b.step({1, 1, 1, 1}, true);
        report("decode", f, d, e);
        EXPECT_LT(e, 1e-4);
        EXPECT_EQ(b.rows_differing(), 0);
      }
      {  // prefill: chunks over cached pages (one sequence fresh), then a decode step
        MlaBatch b(p, f, d, 3, {38, 66, 195});
        b.step({0, 45, 130}, false);
        const double e = b.step({37, 20, 64}, true);
        report("prefill", f, d, e);
        EXPECT_LT(e, 1e-4);
        const double e2 = b.step({1, 1, 1}, true);
        report("decode", f, d, e2);
        EXPECT_LT(e2, 1e-4);
        EXPECT_EQ(b.rows_differing(), 0);
      }
    }
  }
  EXPECT_EQ(mla_fallbacks(*p.gpu_), 0);
}

// Decode steps in graph mode: the first captures, the next replay while the contexts grow
// inside one bucket of the plan (mla.cu), each step against the CPU.
TEST(MlaBackend, DecodeStepsReplayCapturedGraphs) {
  for (int fi : {0, 8}) {  // bf16, FlashMLA
    for (const MlaDims& d : {kMlaDims[1], kMlaDims[2]}) {
      const MlaFormat& f = kMlaFormats[fi];
      SCOPED_TRACE(std::string(f.name) + " " + std::to_string(d.latent));
      Pair p;
      MlaBatch b(p, f, d, 16, {8, 30, 400, 700});
      b.step({0, 20, 390, 690}, false);
      p.cuda().set_graph_mode(true);
      const cuda::GraphStats before = p.cuda().graph_stats();
      for (int i = 0; i < 5; ++i) {
        const double e = b.step({1, 1, 1, 1}, true);
        report("graph", f, d, e);
        EXPECT_LT(e, 1e-4) << "step " << i;
      }
      const cuda::GraphStats& after = p.cuda().graph_stats();
      std::printf("  graphs: %lld captured, %lld replayed\n",
                  (long long)(after.captures - before.captures),
                  (long long)(after.replays - before.replays));
      EXPECT_GE(after.replays - before.replays, 4);
      p.cuda().set_graph_mode(false);
      EXPECT_EQ(b.rows_differing(), 0);
      EXPECT_EQ(mla_fallbacks(*p.gpu_), 0);
    }
  }
}

// (kv_lora_rank, rope) = (64, 16) has no kernel: the CPU twin runs it, each call counted, and the
// latent write stays on the GPU.
TEST(MlaBackend, UnbuiltDimsRunOnTheCpuTwinCounted) {
  Pair p;
  const MlaDims d{64, 16, 3};
  for (int fi : {0, 5}) {
    const MlaFormat& f = kMlaFormats[fi];
    const int64_t before = mla_fallbacks(*p.gpu_);
    MlaBatch b(p, f, d, 4, {10, 50});
    b.step({3, 40}, false);
    const double e = b.step({7, 1}, true);
    report("twin", f, d, e);
    EXPECT_LT(e, 1e-4);
    EXPECT_EQ(mla_fallbacks(*p.gpu_), before + 1);
    EXPECT_EQ(b.rows_differing(), 0);
  }
}

}  // namespace
}  // namespace strata::testing
