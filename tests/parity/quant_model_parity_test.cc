// Packed weight formats through the CUDA backend's own entry points (issue 21): upload_linear
// keeps INT4 and FP8-block weights packed, linear / linear_silu_mul pick the kernel by rows,
// the bytes a model takes equal the planner's figure, and the quantized fixtures' logits match
// the Hugging Face references.
//
// Bounds, with the reasoning:
// - Linears against the CPU twin (the same dequantized weights in float32, inputs rounded to
//   bf16 on the host so both sides see the same x): INT4 and FP8 dequantize exactly (bit for bit
//   the reference's bf16 weights; FP8 beyond the GEMV's rows through a bf16 copy and cuBLAS) and
//   differ only by float32 summation order and the output's bf16 rounding: NMSE ~4e-6, bound
//   3e-5. The opt-in FP8 W8A8 GEMM (CudaTunables::fp8_w8a8) quantizes activations to e4m3 per
//   128 values (DeepSeek-V3's act_quant; the e4m3 step is 2^-4 relative): NMSE ~3e-4-6e-4
//   measured, bound 2e-3.
// - Fixture logits: the bf16 model bound of model_parity_test (5e-4) for W4A16 Llama. The tiny
//   DeepSeek fixtures' random 8-expert routers flip a token's expert choice on the bf16 rounding
//   of the hidden states (measured 2026-12-01 with MoE on the CPU twin: seq0 of the bf16 fixture
//   reaches NMSE 7.9e-3, the INT4-expert one 7.5e-3, the FP8 one 3.9e-2 — prefill and
//   token-by-token alike, so not a kernel's rows — while every seq1 stays under 3e-4): bounded
//   at kDeepseekNmse. MoE now runs on the GPU (issue 23), which routes the same logits as the
//   CPU except at float near-ties (moe_backend_parity_test.cc checks that in every layer), so
//   the flips against float32 Hugging Face remain: the printed NMSE per sequence is the measure
//   to tighten the bound with. No MoE op may run on the CPU twin (MLA may, until issue 22).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>

#include "arch/model.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "model/config.h"
#include "model/inventory.h"
#include "model/weights.h"
#include "support/counting_backend.h"
#include "support/golden.h"

namespace strata::testing {
namespace {

constexpr double kExactWeightNmse = 3e-5;
constexpr double kW8A8Nmse = 2e-3;
constexpr double kDeepseekNmse = 6e-2;

// A random [out, in] weight stored in `f`: INT4 nibbles and bf16 scales, or fp8 values within
// ±448 and float32 block scales.
HostLinearWeight random_weight(const LinearFormat& f, int64_t out, int64_t in, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  HostLinearWeight w;
  w.format = f;
  w.out = out;
  w.in = in;
  w.values.resize(size_t(w.matrix_values_bytes()));
  w.scales.resize(size_t(w.matrix_scales_bytes()));
  if (f.format == WeightFormat::kInt4Group) {
    for (uint8_t& b : w.values) b = uint8_t(rng());
    for (size_t i = 0; i < w.scales.size() / 2; ++i) {
      const uint16_t s = f32_to_bf16(0.02f * (0.5f + std::abs(u(rng))));
      std::memcpy(w.scales.data() + 2 * i, &s, 2);
    }
  } else {
    for (uint8_t& b : w.values) b = f32_to_fp8_e4m3(u(rng) * 448.0f);
    for (size_t i = 0; i < w.scales.size() / 4; ++i) {
      const float s = 1e-4f * (0.5f + std::abs(u(rng)));
      std::memcpy(w.scales.data() + 4 * i, &s, 4);
    }
  }
  return w;
}

struct LinearCase {
  LinearFormat format;
  int64_t out, in;
  bool bias;
};

std::vector<float> run_linear(Backend& be, const LinearWeight& w, const std::vector<float>& x,
                              int64_t m, bool glu) {
  const int64_t in = w.in_features(), out = glu ? w.out_features() / 2 : w.out_features();
  auto xd = be.upload(Tensor::make(const_cast<float*>(x.data()), DType::kF32, {m, in}),
                      be.activation_dtype());
  auto od = be.alloc(be.activation_dtype(), {m, out});
  if (glu)
    be.linear_silu_mul(*xd, w, *od);
  else
    be.linear(*xd, w, *od);
  std::vector<float> o(size_t(m * out));
  be.download_f32(*od, o.data());
  return o;
}

TEST(QuantLinear, BackendMatchesCpuTwin) {
  auto cpu = make_cpu_backend();
  auto gpu = make_cuda_backend();
  const WeightPolicy policy = gpu->weight_policy();
  std::printf("CUDA weight policy: fp8 block kept %d, int4 kept %d\n", policy.keep_fp8_block,
              policy.keep_int4);
  EXPECT_TRUE(policy.keep_fp8_block && policy.keep_int4);
  const LinearFormat i4g32{.format = WeightFormat::kInt4Group, .group_size = 32};
  const LinearFormat i4g128{.format = WeightFormat::kInt4Group, .group_size = 128};
  const LinearFormat f8{.format = WeightFormat::kFp8Block, .block_out = 128, .block_in = 128};
  std::mt19937 rng(21);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  auto* cuda = dynamic_cast<cuda::CudaBackend*>(gpu.get());
  ASSERT_NE(cuda, nullptr);
  for (const bool w8a8 : {false, true}) {
    cuda->tune([&](cuda::CudaTunables& t) { t.fp8_w8a8 = w8a8; });
    std::printf("FP8 beyond the GEMV: %s\n", w8a8 ? "W8A8 (opt-in)" : "W8A16 (default)");
    for (const LinearCase& c :
         {LinearCase{i4g32, 528, 1056, false}, LinearCase{i4g128, 320, 1024, true},
          LinearCase{f8, 300, 1040, false}, LinearCase{f8, 576, 7168, true}}) {
      const HostLinearWeight hw = random_weight(c.format, c.out, c.in, rng);
      std::vector<float> bias(size_t(c.out));
      for (float& b : bias) b = 0.1f * u(rng);
      const Tensor bias_t = c.bias ? Tensor::make(bias.data(), DType::kF32, {c.out}) : Tensor{};
      const LinearWeight wc = cpu->upload_linear(hw, bias_t), wg = gpu->upload_linear(hw, bias_t);
      EXPECT_EQ(wg.format, c.format) << "the CUDA backend keeps " << c.format.str() << " packed";
      for (int64_t m : {1, 2, 5, 16, 17, 64, 300}) {
        std::vector<float> x(size_t(m * c.in));
        for (float& v : x) v = round_to_bf16(u(rng));
        const double e = nmse(run_linear(*gpu, wg, x, m, false), run_linear(*cpu, wc, x, m, false));
        const bool lossy = w8a8 && c.format.format == WeightFormat::kFp8Block && m > 16;
        std::printf("linear %s out %ld in %ld bias %d m %ld: nmse %.3g\n", c.format.str().c_str(),
                    long(c.out), long(c.in), int(c.bias), long(m), e);
        EXPECT_LT(e, lossy ? kW8A8Nmse : kExactWeightNmse) << c.format.str() << " m " << m;
      }
    }
    // The fused SwiGLU path: gate rows then up rows of one weight.
    for (const LinearFormat& f : {i4g128, f8}) {
      const int64_t inter = 256, in = 1024;
      const HostLinearWeight hw = random_weight(f, 2 * inter, in, rng);
      const LinearWeight wc = cpu->upload_linear(hw, Tensor{}),
                         wg = gpu->upload_linear(hw, Tensor{});
      for (int64_t m : {1, 3, 16, 40}) {
        std::vector<float> x(size_t(m * in));
        for (float& v : x) v = round_to_bf16(u(rng));
        const double e = nmse(run_linear(*gpu, wg, x, m, true), run_linear(*cpu, wc, x, m, true));
        std::printf("linear_silu_mul %s inter %ld m %ld: nmse %.3g\n", f.str().c_str(), long(inter),
                    long(m), e);
        const bool lossy = w8a8 && f.format == WeightFormat::kFp8Block && m > 16;
        EXPECT_LT(e, lossy ? kW8A8Nmse : 4 * kExactWeightNmse) << f.str() << " m " << m;
      }
    }
  }
  cuda->tune([](cuda::CudaTunables& t) { t.fp8_w8a8 = false; });
}

std::vector<std::string> model_dirs() {
  const std::string s = STRATA_SHARED_DIR;
  std::vector<std::string> dirs;
  for (const std::string& root :
       {s + "/fixtures/tiny", std::string(STRATA_REPO_FIXTURES_DIR) + "/tiny"})
    if (std::filesystem::is_directory(root))
      for (const auto& e : std::filesystem::directory_iterator(root))
        if (std::filesystem::exists(e.path() / "model.safetensors")) dirs.push_back(e.path());
  for (const char* m : {"house-llama", "house-mla"})
    if (std::filesystem::exists(s + "/models/" + m + "/model.safetensors"))
      dirs.push_back(s + "/models/" + m);
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

// The planner's figure (Deployment::weight_policy = the backend's) is what the CUDA backend
// really holds for every fixture, packed formats included.
TEST(QuantWeightBytes, CudaBytesEqualThePlannersFigure) {
  int checked = 0;
  for (const std::string& dir : model_dirs()) {
    auto spec = load_model_spec(dir);
    ASSERT_TRUE(spec.ok()) << spec.status().to_string();
    auto ws = WeightStore::open(dir, spec->quant);
    ASSERT_TRUE(ws.ok()) << ws.status().to_string();
    CountingBackend<cuda::CudaBackend> be;
    auto model = create_model(*spec, *ws, be);
    ASSERT_TRUE(model.ok()) << dir << ": " << model.status().to_string();
    const int64_t planned = summarize_inventory(*spec, build_inventory(*spec), 1,
                                                quant_layout(*spec), be.weight_policy())
                                .bytes_per_rank;
    std::printf("%s: %ld bytes loaded, planner %ld\n", dir.c_str(), long(be.weight_bytes()),
                long(planned));
    EXPECT_EQ(be.weight_bytes(), planned) << dir;
    // And the device holds that: weights take their exact size (Lifetime::kResident), not a
    // size class (up to a quarter more). Slack: 256-byte alignment per tensor, small tables.
    const int64_t in_use = int64_t(be.pool_bytes_in_use());
    std::printf("%s: %ld bytes of device pool in use\n", dir.c_str(), long(in_use));
    EXPECT_GE(in_use, planned) << dir;
    EXPECT_LE(in_use, planned + planned / 200 + (int64_t(1) << 20)) << dir;
    ++checked;
  }
  EXPECT_GE(checked, 10);
}

struct QuantFixture {
  std::string name, dir;
  double max_nmse;
  bool w8a8 = false;  // the opt-in FP8 W8A8 GEMM (reported, loosely bounded)
};

class QuantModel : public ::testing::TestWithParam<QuantFixture> {};

TEST_P(QuantModel, LogitsMatchHuggingFace) {
  auto gpu = make_cuda_backend();
  const bool w8a8 = GetParam().w8a8;
  dynamic_cast<cuda::CudaBackend&>(*gpu).tune([&](cuda::CudaTunables& t) { t.fp8_w8a8 = w8a8; });
  auto m = load_model(GetParam().dir, *gpu);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  Model& model = **m;
  Reference ref(GetParam().dir + "/reference.safetensors");
  ASSERT_TRUE(ref.ok());
  for (int i = 0; ref.has("seq" + std::to_string(i) + ".input_ids"); ++i) {
    const std::string seq = "seq" + std::to_string(i);
    auto ids = ref.i32(seq + ".input_ids");
    auto expected = ref.f32(seq + ".logits");
    // Prefill in one step (the GEMM paths), then token by token (the GEMV paths).
    for (int chunk : {int(ids.size()), 1}) {
      SingleSequence run(model, 3, int(ids.size()), DType::kBF16);
      std::vector<float> logits;
      for (size_t p = 0; p < ids.size(); p += size_t(chunk)) {
        std::vector<int32_t> part(ids.begin() + long(p),
                                  ids.begin() + long(std::min(ids.size(), p + size_t(chunk))));
        auto l = run.step(part, true);
        logits.insert(logits.end(), l.begin(), l.end());
      }
      double gap = 0;
      const double e = nmse(logits, expected);
      const double agree = argmax_agreement(logits, expected, model.spec().vocab_size, &gap);
      std::printf("%s %s chunk %d: nmse %.3g, argmax agreement %.3f (worst gap %.3g)\n",
                  GetParam().name.c_str(), seq.c_str(), chunk, e, agree, gap);
      EXPECT_LT(e, GetParam().max_nmse) << seq << " chunk " << chunk;
      if (GetParam().max_nmse <= 5e-4) {
        EXPECT_LT(gap, 0.02) << seq << ": an argmax disagreement that is not a near-tie";
      }
    }
  }
  auto prompt = ref.i32("greedy0.prompt_ids");
  auto expected = ref.i32("greedy0.output_ids");
  SingleSequence run(model, 4, int(prompt.size() + expected.size()), DType::kBF16);
  auto got = run.greedy(prompt, int(expected.size()), 5);
  int same = 0;
  while (same < int(got.size()) && got[size_t(same)] == expected[size_t(same)]) ++same;
  std::printf("%s greedy: first %d of %zu tokens equal HF float32\n", GetParam().name.c_str(), same,
              expected.size());
  for (const auto& [op, calls] : gpu->cpu_fallback_counts()) {
    if (calls > 0)
      std::printf("%s: %s ran on the CPU twin %lld times\n", GetParam().name.c_str(), op.c_str(),
                  (long long)calls);
    if (op == "moe_route" || op == "moe_experts" || op == "linear_f32_out") {
      EXPECT_EQ(calls, 0) << op;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, QuantModel,
    ::testing::Values(
        QuantFixture{"llama_w4a16", STRATA_REPO_FIXTURES_DIR "/tiny/llama-w4a16", 5e-4},
        QuantFixture{"deepseek_v3_fp8_block",
                     STRATA_REPO_FIXTURES_DIR "/tiny/deepseek-v3-fp8-block", kDeepseekNmse},
        QuantFixture{"deepseek_v3_fp8_block_w8a8",
                     STRATA_REPO_FIXTURES_DIR "/tiny/deepseek-v3-fp8-block", 0.2, true},
        QuantFixture{"deepseek_v3_int4_experts",
                     STRATA_SHARED_DIR "/fixtures/tiny/deepseek-v3-int4-experts", kDeepseekNmse},
        // The bf16 fixtures: what the DeepSeek path on the GPU gives without any packed format
        // (V3 routing: sigmoid + bias + groups; V2-Lite: softmax, no renormalization).
        QuantFixture{"deepseek_v3_mla_moe_bf16",
                     STRATA_SHARED_DIR "/fixtures/tiny/deepseek-v3-mla-moe", kDeepseekNmse},
        QuantFixture{"deepseek_v2lite_style_bf16",
                     STRATA_SHARED_DIR "/fixtures/tiny/deepseek-v2lite-style", kDeepseekNmse}),
    [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace strata::testing
