// MLA models (DeepSeek-V2/V3 family: absorbed MLA, then MoE) on the CUDA backend with MLA on the
// GPU (issue 22): the tiny DeepSeek fixtures and house-mla against the Hugging Face float32
// references, against the same GPU model whose MLA runs on the CPU reference, and greedy against
// the CPU backend. MoE still runs on the CPU twin here until its GPU version lands (issue 23);
// the tests count MLA fallbacks only.
//
// Bounds, with the reasoning:
//  - vs Hugging Face (bf16 end to end against float32): house-mla, the trained model, the bf16
//    model bound of model_parity_test, NMSE < 5e-4 (measured 1.3e-5-1.5e-4 at tp 1 with MLA on
//    the CPU twin, bench/RESULTS.md), argmax disagreements only at near-ties (< 2% of the row's
//    largest |logit|). The tiny fixtures' random 8-expert routers flip a token's experts on bf16
//    rounding (quant_model_parity_test: seq0 NMSE up to 7.9e-3 with MLA on the twin, every seq1
//    under 3e-4): NMSE < 6e-2 (kDeepseekNmse there) and argmax agreement >= 90%.
//  - vs the same GPU model with MLA through the CPU reference (ReferenceMlaBackend: host copies,
//    float32 attention, the output rounded to bf16): everything else runs the same kernels on
//    the same values, so what differs is the MLA kernels' rounding (P and the output to bf16:
//    ~1e-6 of NMSE per layer). Layer 0's attention output (after W_UV; its inputs are the same
//    bits on both sides, no MoE before it): NMSE < 1e-4, the op bound. Logits: NMSE < 5e-4 for
//    house-mla; < 5e-3 for the tiny fixtures, whose routers may still flip a near-tie on that
//    difference (one flip costs ~1e-3-1e-2, far below what a wrong row, scale or page gives:
//    O(1)).
//  - greedy: the CUDA backend's tokens (eager and CUDA graphs, which must be identical to each
//    other: the same launches replayed) equal the CPU backend's, or first differ where the CPU's
//    own logits are a near-tie (< 2% of the row's largest |logit|), on every fixture's greedy
//    prompts and house-mla's 400-token long prompt (64 tokens).
//  - house-mla's 768-token long reference, prefilled in chunks of 100 over the cached pages:
//    argmax agreement >= 99% (as house-llama's).
//  - no mla_attention call runs on the CPU twin (cpu_fallback_counts).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "core/dtype.h"
#include "parity/mla_sequences.h"
#include "support/golden.h"

namespace strata::testing {
namespace {

// The CUDA backend with mla_attention on the CPU reference through host copies: the reference
// point of the GPU kernels inside an otherwise identical GPU model.
class ReferenceMlaBackend : public cuda::CudaBackend {
 public:
  void mla_attention(const Tensor& q_latent, const KvStorage& kv, int layer,
                     const AttentionMetadata& meta, const MlaArgs& args,
                     const Tensor& out) override {
    std::vector<float> q(size_t(q_latent.numel())), o(size_t(out.numel()));
    download_f32(q_latent, q.data());  // ends the step: the layer's KV writes are done
    cpu::CpuKvStorage host_kv(kv.layout());
    host_kv.set_scales(layer, kv.k_scale(layer), kv.v_scale(layer));
    const Tensor dk = kv.k(layer), hk = host_kv.k(layer);
    ASSERT_EQ(dk.nbytes(), hk.nbytes());
    ASSERT_EQ(cudaMemcpy(hk.data, dk.data, size_t(dk.nbytes()), cudaMemcpyDeviceToHost),
              cudaSuccess);
    cpu::CpuBackend cpu;
    cpu.mla_attention(Tensor::make(q.data(), DType::kF32, q_latent.shape), host_kv, layer, meta,
                      args, Tensor::make(o.data(), DType::kF32, out.shape));
    std::vector<uint16_t> bits(o.size());
    for (size_t i = 0; i < o.size(); ++i) bits[i] = f32_to_bf16(o[i]);
    ASSERT_EQ(cudaMemcpy(out.data, bits.data(), bits.size() * 2, cudaMemcpyHostToDevice),
              cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // a pageable copy may return before its DMA
  }
};

struct Fixture {
  std::string name, model_dir, reference_dir;
  double hf_nmse, ref_mla_nmse;
  bool trained;  // argmax disagreements with HF must be near-ties
};

std::vector<Fixture> fixtures() {
  const std::string s = shared_dir();
  std::vector<Fixture> f;
  for (const char* n : {"deepseek-v3-mla-moe", "deepseek-v2lite-style", "deepseek-v3-int4-experts"})
    f.push_back({n, s + "/fixtures/tiny/" + n, s + "/fixtures/tiny/" + n, 6e-2, 5e-3, false});
  f.push_back({"house-mla", s + "/models/house-mla", s + "/fixtures/house-mla", 5e-4, 5e-4, true});
  return f;
}

std::unique_ptr<Model> load(Backend& be, const std::string& dir) {
  auto m = load_model(dir, be);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  return m.ok() ? std::move(m).value() : nullptr;
}

// Logits of every position of `ids`, prefilled in chunks of `chunk` (1: decode steps); layer 0's
// attention output (after W_UV) of every position into `attn0`.
std::vector<float> run_logits(Model& m, const std::vector<int32_t>& ids, int chunk,
                              std::vector<float>* attn0) {
  m.set_tracer([&m, attn0](std::string_view name, int layer, const Tensor& t) {
    if (name != "attn" || layer != 0) return;
    std::vector<float> v(size_t(t.numel()));
    m.backend().download_f32(t, v.data());
    attn0->insert(attn0->end(), v.begin(), v.end());
  });
  SingleSequence run(m, 3, int(ids.size()), DType::kBF16);
  std::vector<float> logits;
  for (size_t p = 0; p < ids.size(); p += size_t(chunk)) {
    std::vector<int32_t> part(ids.begin() + long(p),
                              ids.begin() + long(std::min(ids.size(), p + size_t(chunk))));
    auto l = run.step(part, true);
    logits.insert(logits.end(), l.begin(), l.end());
  }
  m.set_tracer(nullptr);
  return logits;
}

class MlaModel : public ::testing::TestWithParam<Fixture> {};

TEST_P(MlaModel, LogitsMatchHuggingFaceAndTheReferenceMla) {
  const Fixture& fx = GetParam();
  auto gpu = make_cuda_backend();
  ReferenceMlaBackend ref_be;
  auto m = load(*gpu, fx.model_dir), rm = load(ref_be, fx.model_dir);
  ASSERT_TRUE(m && rm);
  Reference ref(fx.reference_dir + "/reference.safetensors");
  ASSERT_TRUE(ref.ok());
  const int64_t vocab = m->spec().vocab_size;
  for (int i = 0; ref.has("seq" + std::to_string(i) + ".input_ids"); ++i) {
    const std::string seq = "seq" + std::to_string(i);
    auto ids = ref.i32(seq + ".input_ids");
    auto expected = ref.f32(seq + ".logits");
    // Prefill in one step (the prefill kernels), then token by token (the decode path).
    for (int chunk : {int(ids.size()), 1}) {
      std::vector<float> attn0, ref_attn0;
      auto logits = run_logits(*m, ids, chunk, &attn0);
      auto ref_logits = run_logits(*rm, ids, chunk, &ref_attn0);
      double gap = 0;
      const double e = nmse(logits, expected), er = nmse(logits, ref_logits);
      const double ea = nmse(attn0, ref_attn0);
      const double agree = argmax_agreement(logits, expected, vocab, &gap);
      double ref_gap = 0;
      const double ref_agree = argmax_agreement(ref_logits, expected, vocab, &ref_gap);
      std::printf(
          "%s %s chunk %d: nmse vs HF %.3g (reference MLA: %.3g), vs the reference MLA "
          "%.3g (layer 0 attention %.3g); argmax agreement with HF %.3f (worst gap %.3g; "
          "reference MLA %.3f)\n",
          fx.name.c_str(), seq.c_str(), chunk, e, nmse(ref_logits, expected), er, ea, agree, gap,
          ref_agree);
      EXPECT_LT(e, fx.hf_nmse) << seq << " chunk " << chunk;
      EXPECT_LT(er, fx.ref_mla_nmse) << seq << " chunk " << chunk;
      ASSERT_EQ(attn0.size(), ref_attn0.size());
      ASSERT_FALSE(attn0.empty());
      EXPECT_LT(ea, 1e-4) << seq << " chunk " << chunk << ": layer 0's MLA output";
      // The tiny random fixtures' MoE routers flip choices at float near-ties (the same model
      // with MLA on the CPU reference disagrees with HF at the same positions: measured 7/8 on
      // seq0 of the V3-style fixtures), so the bound is the reference MLA's own agreement, less
      // at most one position: the GPU's MLA must not add disagreements of its own.
      EXPECT_GE(agree, ref_agree - 1.0 / double(ids.size()) - 1e-9) << seq << " chunk " << chunk;
      if (fx.trained) {
        EXPECT_LT(gap, 0.02) << seq << ": an argmax disagreement that is not a near-tie";
      }
    }
  }
  EXPECT_EQ(mla_fallbacks(*gpu), 0);
}

// Greedy tokens and each step's logits (the logits that chose each token).
struct Greedy {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;
};

Greedy greedy_with_logits(Model& m, DType kv, const std::vector<int32_t>& prompt, int n) {
  SingleSequence run(m, 16, int(prompt.size()) + n, kv);
  Greedy g;
  std::vector<float> l;
  for (size_t i = 0; i < prompt.size(); i += 64) {
    std::vector<int32_t> part(prompt.begin() + long(i),
                              prompt.begin() + long(std::min(prompt.size(), i + 64)));
    l = run.step(part, false);
  }
  for (int i = 0; i < n; ++i) {
    const int32_t next = int32_t(std::max_element(l.begin(), l.end()) - l.begin());
    g.tokens.push_back(next);
    g.logits.push_back(l);
    if (i + 1 < n) l = run.step({next}, false);
  }
  return g;
}

// Graph mode's launch merges, side branches and segments all off.
void no_merges(cuda::CudaTunables& t) {
  t.gemv_pair_fusion = false;
  t.side_branch_max_rows = 0;
  t.graph_segment_launches = 0;
}

constexpr int kTestSegment = 8;  // launches a graph segment in the segments pass

TEST_P(MlaModel, GreedyMatchesTheCpuBackend) {
  const Fixture& fx = GetParam();
  auto cpu = make_cpu_backend();
  auto gpu = make_cuda_backend();
  auto cm = load(*cpu, fx.model_dir), gm = load(*gpu, fx.model_dir);
  ASSERT_TRUE(cm && gm);
  auto& cuda = dynamic_cast<cuda::CudaBackend&>(*gpu);
  Reference ref(fx.reference_dir + "/reference.safetensors");
  std::vector<std::vector<int32_t>> prompts;
  std::vector<int> lengths;
  for (int i = 0; ref.has("greedy" + std::to_string(i) + ".prompt_ids"); ++i) {
    prompts.push_back(ref.i32("greedy" + std::to_string(i) + ".prompt_ids"));
    lengths.push_back(int(ref.i32("greedy" + std::to_string(i) + ".output_ids").size()));
  }
  if (fx.name == "house-mla") {
    Reference long_ref(fx.reference_dir + "/reference-long.safetensors");
    prompts.push_back(long_ref.i32("longgreedy0.prompt_ids"));
    lengths.push_back(64);
  }
  ASSERT_FALSE(prompts.empty());
  for (size_t i = 0; i < prompts.size(); ++i) {
    const int n = lengths[i];
    const Greedy want = greedy_with_logits(*cm, DType::kF32, prompts[i], n);
    std::vector<int32_t> eager;
    // Eager, graphs without the graph-mode merges, side branches and segments, then with each
    // alone (the GEMV pair merge and side branches on a second stream, both on by default) and
    // both, and steps in segments (kTestSegment launches:
    // a tiny model's step is shorter than the default 64; then growing from 2): each must give
    // the eager bits. (The q_a norm inside q_b's GEMV, gemv_norm_fusion, merges only norms of more
    // than 256 values: GemvNorm.GraphModeRunsTheNormInsideTheGemv tests it.)
    struct Pass {
      const char* name;
      bool graphs;
      void (*tune)(cuda::CudaTunables&);
    };
    const Pass passes[] = {
        {"eager", false, nullptr},
        {"graphs, no merges or side branches", true, no_merges},
        {"graphs + gemv pair", true,
         [](cuda::CudaTunables& t) {
           no_merges(t);
           t.gemv_pair_fusion = true;
         }},
        {"graphs + side branches", true,
         [](cuda::CudaTunables& t) {
           no_merges(t);
           t.side_branch_max_rows = 2;
         }},
        {"graphs + both", true,
         [](cuda::CudaTunables& t) {
           t.gemv_pair_fusion = true;
           t.side_branch_max_rows = 2;
         }},
        // A q_lora layer's query as separate launches (mla_query_fusion, on by default, off;
        // mla_query_parity_test.cc).
        {"graphs + both, the MLA query unfused", true,
         [](cuda::CudaTunables& t) { t.mla_query_fusion = false; }},
        // W_UV and o_proj as one launch with a grid barrier (head_gemv_linear_fusion, off by
        // default: two launches; head_gemv_linear_parity_test.cc).
        {"graphs + both, W_UV and o_proj as one launch", true,
         [](cuda::CudaTunables& t) { t.head_gemv_linear_fusion = true; }},
        // Decode steps' attention on the mma kernel, not the decode kernel (mla_decode_min_rows).
        {"graphs + both, MLA on the mma kernel", true,
         [](cuda::CudaTunables& t) { t.mla_decode_min_rows = 1 << 20; }},
        // Steps launched as graphs of 8 launches each while the rest is recorded.
        {"graphs in segments of 8 launches", true,
         [](cuda::CudaTunables& t) { t.graph_segment_launches = kTestSegment; }},
        // Segments of 2, 4, then 8 launches (graph_first_segment_launches).
        {"graphs in growing segments", true,
         [](cuda::CudaTunables& t) {
           t.graph_segment_launches = kTestSegment;
           t.graph_first_segment_launches = 2;
         }},
    };
    const cuda::CudaTunables defaults = cuda.tunables();
    for (const Pass& pass : passes) {
      const bool graphs = pass.graphs;
      cuda.set_graph_mode(graphs);
      if (pass.tune) cuda.tune(pass.tune);
      const int64_t segments = cuda.graph_stats().segments;
      SingleSequence g(*gm, 16, int(prompts[i].size()) + n, DType::kBF16);
      auto got = g.greedy(prompts[i], n, 64);
      if (cuda.tunables().graph_segment_launches == kTestSegment) {
        EXPECT_GT(cuda.graph_stats().segments, segments) << pass.name << ": no segment launched";
      }
      int same = 0;
      while (same < n && got[size_t(same)] == want.tokens[size_t(same)]) ++same;
      double gap = 0;  // the CPU's own margin at the first difference
      if (same < n) {
        const std::vector<float>& row = want.logits[size_t(same)];
        float scale = 0;
        for (float x : row) scale = std::max(scale, std::fabs(x));
        gap =
            double(row[size_t(want.tokens[size_t(same)])] - row[size_t(got[size_t(same)])]) / scale;
      }
      std::printf(
          "%s prompt %zu (%zu tokens), %s: %d of %d greedy tokens equal the CPU "
          "backend's%s (CPU gap there %.3g)\n",
          fx.name.c_str(), i, prompts[i].size(), pass.name, same, n,
          same < n ? ", then a difference" : "", gap);
      EXPECT_LT(gap, 0.02) << "prompt " << i << ": greedy left the CPU's at token " << same
                           << ", not a near-tie";
      if (!graphs) {
        eager = got;
      } else {
        EXPECT_EQ(got, eager) << "prompt " << i << ": CUDA graphs changed the tokens"
                              << " (" << pass.name << ")";
      }
      cuda.set_tunables(defaults);
    }
    cuda.set_graph_mode(false);
  }
  const cuda::GraphStats& st = cuda.graph_stats();
  std::printf("%s: graphs captured %lld, replayed %lld\n", fx.name.c_str(), (long long)st.captures,
              (long long)st.replays);
  EXPECT_GT(st.replays, 0);
  EXPECT_EQ(mla_fallbacks(*gpu), 0);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, MlaModel, ::testing::ValuesIn(fixtures()), [](const auto& info) {
  std::string n = info.param.name;
  for (char& c : n)
    if (c == '-') c = '_';
  return n;
});

// house-mla over 768 positions, prefilled in chunks of 100 over the cached pages: argmax vs HF.
TEST(MlaModelLong, HouseMlaArgmax) {
  auto gpu = make_cuda_backend();
  auto m = load(*gpu, shared_dir() + "/models/house-mla");
  ASSERT_TRUE(m);
  Reference ref(shared_dir() + "/fixtures/house-mla/reference-long.safetensors");
  auto ids = ref.i32("long0.input_ids");
  auto argmax = ref.i32("long0.argmax");
  SingleSequence run(*m, 16, int(ids.size()), DType::kBF16);
  const int64_t vocab = m->spec().vocab_size;
  int same = 0, total = 0;
  for (size_t i = 0; i < ids.size(); i += 100) {
    std::vector<int32_t> part(ids.begin() + long(i),
                              ids.begin() + long(std::min(ids.size(), i + 100)));
    auto logits = run.step(part, true);
    for (size_t r = 0; r < part.size(); ++r) {
      const auto row = logits.begin() + long(r * size_t(vocab));
      same += int(std::max_element(row, row + vocab) - row) == argmax[i + r];
      ++total;
    }
  }
  std::printf("house-mla long: argmax agreement %d / %d\n", same, total);
  EXPECT_GE(double(same) / total, 0.99);
  EXPECT_EQ(mla_fallbacks(*gpu), 0);
}

}  // namespace
}  // namespace strata::testing
