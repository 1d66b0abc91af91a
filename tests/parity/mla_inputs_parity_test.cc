// MLA's attention inputs in one launch (Backend::mla_attention_inputs; the CUDA backend's
// mla_inputs.cu) against the same op as separate launches (CudaTunables::mla_inputs_fusion off:
// rms_norm_columns, rope of both parts, copy_columns, kv_write) and against the CPU backend.
//
// What must hold and the bounds:
//  - bit for bit the separate launches' results: the cache rows left in kv_row, q's rotated dims,
//    q_latent (its other columns untouched) and every byte of the KV storage, in every layout of
//    mla_sequences.h's kMlaFormats, at the tiny fixtures', house-mla's and the real models' dims
//    with 4 to 128 heads, neox and interleaved pairs, bf16 and f32 norm weights, positions up to
//    ~1e5, decode (4 tokens) and prefill (41 tokens, page size 3) batches;
//  - the bytes of the fused launch's cache rows are the CPU's kv_write of the rows it left in
//    kv_row (the encoding, checked apart from the GPU's own KV write);
//  - against the CPU backend's op on the same values (float32): NMSE of kv_row, q and q_latent
//    < 1e-5 (bf16 rounding of one op: ~1e-6);
//  - the fused call is one launch (mla_inputs) and the separate one is not: each run's per-op
//    profile says which ran, so the comparison cannot be of one path with itself;
//  - whole models (the DeepSeek fixtures and house-mla where the carry has it; bf16 and fp8 KV,
//    eager and CUDA graphs): every logit of a prefill and of greedy decode steps, and every byte
//    of every layer's KV, the same with the fused launch as with the separate launches (and the
//    fused run reproduces itself, the check that the comparison can hold at all).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "parity/mla_sequences.h"
#include "parity/op_pair.h"
#include "support/golden.h"

namespace strata::testing {
namespace {

using parity::device_bytes;
using parity::Pair;
using parity::profiled;

// The op's inputs on one backend (their values are the same on every backend made by `make`).
struct Inputs {
  DeviceTensorPtr kv_row, norm, q, q_latent;
};

struct Case {
  MlaDims d;
  int nope;
};
// The tiny fixtures', house-mla's, the real models' at 16 heads (Moonlight, V2-Lite), 8 (a
// Kimi-K2.5 rank of tp 8) and 128 (DeepSeek-V3 at tp 1).
const Case kCases[] = {{{32, 8, 4}, 16},
                       {{128, 32, 5}, 64},
                       {{512, 64, 16}, 128},
                       {{512, 64, 8}, 128},
                       {{512, 64, 128}, 128}};

class OpRun {
 public:
  OpRun(Pair& p, const Case& c, const MlaFormat& f, bool interleaved, bool norm_f32, int page,
        const std::vector<int>& fresh)
      : p_(p), c_(c), f_(f), norm_f32_(norm_f32), seqs_(p.rng(), page, fresh) {
    lay_ = mla_test_layout(f, c.d, page, seqs_.num_pages());
    meta_ = seqs_.grow(fresh);
    // Positions far along (rope's range reduction), one per token.
    for (int i = 0; i < meta_.num_tokens; ++i) positions_.push_back(int32_t(p.rng()() % 100000));
    meta_.positions = positions_.data();
    const int P = c.d.rope;
    for (int i = 0; i < P / 2; ++i)
      inv_freq_.push_back(std::pow(10000.0f, -2.0f * float(i) / float(P)));
    args_ = MlaInputsArgs{.eps = 1e-6f,
                          .rope = RopeArgs{.inv_freq = inv_freq_.data(),
                                           .attention_factor = 1.1f,
                                           .rotary_dim = P,
                                           .offset = 0,
                                           .interleaved = interleaved},
                          .q_rope_offset = c.nope};
    const int64_t t = meta_.num_tokens, width = c.d.latent + P, heads = c.d.heads;
    kv_row_ = p.random(t * width, f.scale);
    q_ = p.random(t * heads * (c.nope + P));
    q_latent_ = p.random(t * heads * width);
    norm_ = p.random(c.d.latent, 0.5f);
    for (float& w : norm_) w = round_to_bf16(w + 1.0f);
  }

  Inputs upload(Backend& be, DType act) {
    const int64_t t = meta_.num_tokens, width = c_.d.latent + c_.d.rope, heads = c_.d.heads;
    auto up = [&](std::vector<float>& v, const Shape& s, DType dt) {
      return be.upload(Tensor::make(v.data(), DType::kF32, s), dt);
    };
    return Inputs{up(kv_row_, {t, width}, act),
                  up(norm_, {c_.d.latent}, act == DType::kF32 || norm_f32_ ? DType::kF32 : act),
                  up(q_, {t, heads, c_.nope + c_.d.rope}, act),
                  up(q_latent_, {t, heads, width}, act)};
  }
  std::unique_ptr<KvStorage> alloc_kv(Backend& be) {
    auto kv = be.alloc_kv(lay_);
    kv->set_scales(1, f_.scale, 1.0f);
    return kv;
  }
  void run(Backend& be, const Inputs& in, KvStorage& kv) {
    be.mla_attention_inputs(*in.kv_row, *in.norm, *in.q, *in.q_latent, args_, kv, 1, meta_);
  }
  const AttentionMetadata& meta() const { return meta_; }
  const KvLayout& layout() const { return lay_; }

 private:
  Pair& p_;
  const Case& c_;
  const MlaFormat& f_;
  bool norm_f32_;
  GrowingSequences seqs_;
  KvLayout lay_;
  AttentionMetadata meta_;
  std::vector<int32_t> positions_;
  std::vector<float> inv_freq_, kv_row_, q_, q_latent_, norm_;
  MlaInputsArgs args_;
};

// One case: the fused launch, the separate launches and the CPU on the same inputs.
void check_case(Pair& p, const Case& c, const MlaFormat& f, bool interleaved, bool norm_f32,
                int page, const std::vector<int>& fresh) {
  SCOPED_TRACE(std::string(f.name) + " " + std::to_string(c.d.latent) + "+" +
               std::to_string(c.d.rope) + " heads " + std::to_string(c.d.heads) +
               (interleaved ? " interleaved" : " neox") + (norm_f32 ? " f32 norm" : "") + " page " +
               std::to_string(page));
  OpRun r(p, c, f, interleaved, norm_f32, page, fresh);
  cuda::CudaBackend& cuda = p.cuda();
  const Inputs fused = r.upload(*p.gpu_, DType::kBF16), sep = r.upload(*p.gpu_, DType::kBF16);
  const Inputs cpu = r.upload(*p.cpu_, DType::kF32);
  auto kv_fused = r.alloc_kv(*p.gpu_), kv_sep = r.alloc_kv(*p.gpu_), kv_cpu = r.alloc_kv(*p.cpu_);

  cuda.tune([](cuda::CudaTunables& t) { t.mla_inputs_fusion = true; });
  const std::string fused_ops = profiled(cuda, [&] { r.run(cuda, fused, *kv_fused); });
  cuda.tune([](cuda::CudaTunables& t) { t.mla_inputs_fusion = false; });
  const std::string sep_ops = profiled(cuda, [&] { r.run(cuda, sep, *kv_sep); });
  cuda.tune([](cuda::CudaTunables& t) { t.mla_inputs_fusion = true; });
  r.run(*p.cpu_, cpu, *kv_cpu);
  EXPECT_NE(fused_ops.find("mla_inputs"), std::string::npos) << fused_ops;
  EXPECT_EQ(fused_ops.find("rms_norm"), std::string::npos) << fused_ops;
  EXPECT_EQ(sep_ops.find("mla_inputs"), std::string::npos) << sep_ops;
  EXPECT_NE(sep_ops.find("rms_norm"), std::string::npos) << sep_ops;

  // Bit for bit the separate launches'.
  EXPECT_EQ(device_bytes(*fused.kv_row), device_bytes(*sep.kv_row)) << "kv_row";
  EXPECT_EQ(device_bytes(*fused.q), device_bytes(*sep.q)) << "q";
  EXPECT_EQ(device_bytes(*fused.q_latent), device_bytes(*sep.q_latent)) << "q_latent";
  for (int layer : {0, 1})
    EXPECT_EQ(device_bytes(kv_fused->k(layer)), device_bytes(kv_sep->k(layer)))
        << "KV layer " << layer;

  // The encoding: the CPU's kv_write of the rows the fused launch left in kv_row.
  const int64_t t = r.meta().num_tokens, width = c.d.latent + c.d.rope;
  std::vector<float> rows = p.get(*fused.kv_row, true);
  auto kv_enc = r.alloc_kv(*p.cpu_);
  p.cpu_->kv_write(*kv_enc, 1, Tensor::make(rows.data(), DType::kF32, {t, width}), Tensor(),
                   r.meta());
  const std::vector<char> gpu_rows = device_bytes(kv_fused->k(1));
  const Tensor enc = kv_enc->k(1);
  const int64_t row_bytes = r.layout().k_row_bytes(1);
  int differ = 0;
  for (int i = 0; i < t; ++i) {
    const int64_t slot = r.meta().slot_mapping[i];
    differ +=
        std::memcmp(gpu_rows.data() + slot * row_bytes,
                    static_cast<const char*>(enc.data) + slot * row_bytes, size_t(row_bytes)) != 0;
  }
  EXPECT_EQ(differ, 0) << "rows whose bytes differ from the CPU's encoding";

  // Against the CPU's op.
  const double e_row = nmse(rows, p.get(*cpu.kv_row, false));
  const double e_q = nmse(p.get(*fused.q, true), p.get(*cpu.q, false));
  const double e_lat = nmse(p.get(*fused.q_latent, true), p.get(*cpu.q_latent, false));
  EXPECT_LT(e_row, 1e-5);
  EXPECT_LT(e_q, 1e-5);
  EXPECT_LT(e_lat, 1e-5);
  std::printf(
      "mla inputs %-30s %3d+%-2d heads %3d %s%s tokens %3lld: nmse vs CPU row %.2g q %.2g "
      "q_latent %.2g\n",
      f.name, c.d.latent, c.d.rope, c.d.heads, interleaved ? "interleaved" : "neox",
      norm_f32 ? " f32-norm" : "", (long long)t, e_row, e_q, e_lat);
}

TEST(MlaInputs, FusedEqualsSeparateLaunchesEveryLayout) {
  Pair p;
  for (const Case& c : kCases) {
    const bool real = c.d.latent == 512;
    for (const MlaFormat& f : kMlaFormats) {
      // The 8- and 128-head cases only change the q part: bf16 and FlashMLA rows.
      if (real && c.d.heads != 16 && std::string(f.name) != "bf16" &&
          std::string(f.name) != "fp8_flashmla")
        continue;
      check_case(p, c, f, false, false, 16, {1, 1, 1, 1});
      check_case(p, c, f, true, c.d.latent == 512, 3, {17, 1, 23});
    }
  }
}

// A model's steps with the fused launch and with the separate launches: logits and KV bytes.
struct ModelRun {
  std::vector<float> logits;
  std::vector<std::vector<char>> kv;  // every layer's bytes
};

ModelRun run_model(Model& m, DType kv_dtype, const std::vector<int32_t>& prompt, int steps) {
  SingleSequence s(m, 16, int(prompt.size()) + steps, kv_dtype);
  ModelRun out;
  std::vector<float> l;
  for (size_t i = 0; i < prompt.size(); i += 16) {
    std::vector<int32_t> part(prompt.begin() + long(i),
                              prompt.begin() + long(std::min(prompt.size(), i + 16)));
    l = s.step(part, true);
    out.logits.insert(out.logits.end(), l.begin(), l.end());
  }
  const int64_t vocab = m.spec().vocab_size;
  for (int i = 0; i < steps; ++i) {
    const auto last = l.end() - vocab;
    const int32_t next = int32_t(std::max_element(last, l.end()) - last);
    l = s.step({next}, false);
    out.logits.insert(out.logits.end(), l.begin(), l.end());
  }
  m.backend().synchronize();
  for (int layer = 0; layer < s.kv().layout().num_layers; ++layer)
    out.kv.push_back(device_bytes(s.kv().k(layer)));
  return out;
}

// A model directory of the shared folder (fixtures/tiny/NAME or models/NAME) and its
// reference (for a prompt).
struct ModelFixture {
  std::string name, model, reference;
};
std::vector<ModelFixture> model_fixtures() {
  const std::string s = shared_dir();
  std::vector<ModelFixture> f;
  for (const char* n : {"deepseek-v3-mla-moe", "deepseek-v2lite-style"})
    f.push_back(
        {n, s + "/fixtures/tiny/" + n, s + "/fixtures/tiny/" + n + "/reference.safetensors"});
  f.push_back(
      {"house-mla", s + "/models/house-mla", s + "/fixtures/house-mla/reference.safetensors"});
  return f;
}

class MlaInputsModel : public ::testing::TestWithParam<ModelFixture> {};

TEST_P(MlaInputsModel, StepsEqualTheSeparateLaunches) {
  const ModelFixture& fx = GetParam();
  if (!std::filesystem::exists(fx.model + "/config.json"))
    GTEST_SKIP() << fx.name << " is not in this carry (" << fx.model << ")";
  auto gpu = make_cuda_backend();
  auto& cuda = dynamic_cast<cuda::CudaBackend&>(*gpu);
  auto loaded = load_model(fx.model, *gpu);
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  Model& m = *loaded.value();
  Reference ref(fx.reference);
  std::vector<int32_t> prompt = ref.i32("seq0.input_ids");
  if (prompt.size() > 40) prompt.resize(40);
  const int layers = m.spec().num_layers;
  for (DType kv : {DType::kBF16, DType::kFP8E4M3}) {
    for (bool graphs : {false, true}) {
      SCOPED_TRACE(fx.name + (kv == DType::kBF16 ? " bf16" : " fp8_e4m3") +
                   (graphs ? " graphs" : " eager"));
      cuda.tune([](cuda::CudaTunables& t) { t.mla_inputs_fusion = true; });
      cuda.set_graph_mode(graphs);
      const ModelRun fused = run_model(m, kv, prompt, 6);
      const ModelRun again = run_model(m, kv, prompt, 6);
      cuda.set_graph_mode(false);
      cuda.tune([](cuda::CudaTunables& t) { t.mla_inputs_fusion = false; });
      cuda.set_graph_mode(graphs);
      const ModelRun sep = run_model(m, kv, prompt, 6);
      cuda.set_graph_mode(false);
      cuda.tune([](cuda::CudaTunables& t) { t.mla_inputs_fusion = true; });
      ASSERT_EQ(fused.logits.size(), sep.logits.size());
      const bool reproducible = fused.logits == again.logits && fused.kv == again.kv;
      EXPECT_TRUE(reproducible) << "the fused run does not reproduce itself";
      int logits_differ = 0;
      for (size_t i = 0; i < fused.logits.size(); ++i)
        logits_differ += std::memcmp(&fused.logits[i], &sep.logits[i], 4) != 0;
      int layers_differ = 0;
      for (int l = 0; l < layers; ++l) layers_differ += fused.kv[size_t(l)] != sep.kv[size_t(l)];
      EXPECT_EQ(logits_differ, 0);
      EXPECT_EQ(layers_differ, 0);
      std::printf("mla inputs model %s %s %s: %zu logits, %d differ; %d of %d layers' KV differ\n",
                  fx.name.c_str(), kv == DType::kBF16 ? "bf16" : "fp8_e4m3",
                  graphs ? "graphs" : "eager", fused.logits.size(), logits_differ, layers_differ,
                  layers);
    }
  }
  // One eager decode step: one mla_inputs launch a layer, no separate norm of the cache row.
  const std::string ops = profiled(cuda, [&] { run_model(m, DType::kBF16, prompt, 1); });
  EXPECT_NE(ops.find("mla_inputs"), std::string::npos) << ops;
  std::printf("%s ops of a prefill + 1 decode step:\n%s", fx.name.c_str(), ops.c_str());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, MlaInputsModel, ::testing::ValuesIn(model_fixtures()),
                         [](const auto& info) {
                           std::string n = info.param.name;
                           for (char& c : n)
                             if (c == '-') c = '_';
                           return n;
                         });

}  // namespace
}  // namespace strata::testing
