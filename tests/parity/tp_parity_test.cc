// Tensor parallelism on several GPUs (the issue-11 acceptance; skipped with fewer than 2 GPUs):
// at tp 2, 4 and 8 (as many as are visible) the CUDA logits match tp 1's on the same GPUs and the
// Hugging Face float32 references within bf16 tolerance.
//
// Bounds: bf16 end to end, and the ranks' partial sums are rounded to bf16 before NCCL adds them,
// so tp N differs from tp 1 by bf16 rounding: NMSE ‖tpN − tp1‖² / ‖tp1‖² < 5e-4 and against HF
// < 5e-4 (the single-GPU model parity bound), argmax agreement with tp 1 >= 90% of positions.
// MoE models: positions whose expert choice is a near-tie in float32 (near_tie_rows, at most
// half of a sequence; house-mla has 4 of 16 in one) are left out of the NMSE bounds — rounding
// may route them differently.
// The house models have 5 heads: they shard only with the uneven (test-only) plan.
#include <gtest/gtest.h>

#ifdef STRATA_HAVE_NCCL
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "arch/tp.h"
#include "core/check.h"
#include "cuda/bench_checkpoint.h"
#include "dist/tp_driver.h"
#include "model/config.h"
#include "model/weights.h"
#include "parity/tp_compare.h"
#include "support/golden.h"

namespace strata::testing {
namespace {

struct Case {
  std::string name, model_dir, reference_dir;
  bool uneven;
};

// Rank 0's sampling path (engine steps): greedy ids of forward_sample equal the argmax of the
// same model's forward logits, and the rows kept for logprobs equal those logits exactly.
void expect_sampling_matches_logits(Model& model, const std::vector<int32_t>& ids,
                                    const std::vector<float>& logits, const std::string& what) {
  const int n = int(ids.size());
  const int64_t vocab = model.spec().vocab_size;
  std::vector<SampleRowParams> params(size_t(n), SampleRowParams{.temperature = 0.0f});
  std::vector<int32_t> sampled(size_t(n), -1), keep = {0, n - 1};
  std::vector<float> kept(keep.size() * size_t(vocab));
  const SampleArgs args{.params = params.data(),
                        .token_ids = sampled.data(),
                        .keep_rows = keep.data(),
                        .num_keep = int(keep.size()),
                        .kept_logits = kept.data()};
  SingleSequence seq(model, 16, n, DType::kBF16);
  seq.step(ids, true, &args);
  int differ = 0;
  for (int i = 0; i < n; ++i) {
    const auto row = logits.begin() + i * vocab;
    differ += sampled[size_t(i)] != int32_t(std::max_element(row, row + vocab) - row);
  }
  EXPECT_EQ(differ, 0) << what << ": greedy ids of forward_sample vs argmax of forward, of " << n;
  for (size_t k = 0; k < keep.size(); ++k)
    EXPECT_TRUE(std::equal(kept.begin() + long(k) * vocab, kept.begin() + long(k + 1) * vocab,
                           logits.begin() + keep[k] * vocab))
        << what << ": kept row " << keep[k] << " differs from forward's";
}

class TpParity : public ::testing::TestWithParam<Case> {};

constexpr double kRoutingTie = 3e-3;  // near_tie_rows: ~3 bf16 ulps of a score near 0.5

TEST_P(TpParity, LogitsMatchTp1AndReference) {
  const Case& c = GetParam();
  int gpus = 0;
  ASSERT_EQ(cudaGetDeviceCount(&gpus), cudaSuccess);
  if (gpus < 2) GTEST_SKIP() << "needs 2+ GPUs, " << gpus << " visible";
  auto spec = load_model_spec(c.model_dir);
  ASSERT_TRUE(spec.ok()) << spec.status().to_string();
  auto weights = WeightStore::open(c.model_dir, spec->quant);
  ASSERT_TRUE(weights.ok());
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  auto backend1 = make_cuda_backend();
  auto tp1 = create_model(*spec, *weights, *backend1);
  ASSERT_TRUE(tp1.ok()) << tp1.status().to_string();
  Reference ref(c.reference_dir + "/reference.safetensors");
  for (int tp = 2; tp <= std::min(gpus, 8); tp *= 2) {
    if (!c.uneven && spec->num_heads % tp != 0) continue;
    const TpConfig config{
        .tp_size = tp, .device = Device::kCuda, .sharding = {.allow_uneven = c.uneven}};
    auto factory = make_tp_rank_factory(config);
    ASSERT_TRUE(factory.ok()) << factory.status().to_string();
    std::unique_ptr<Backend> backend0;
    auto tpn = create_tp_model(*spec, *weights, config, *factory, &backend0);
    ASSERT_TRUE(tpn.ok()) << c.name << " tp " << tp << ": " << tpn.status().to_string();
    for (int i = 0; ref.has("seq" + std::to_string(i) + ".input_ids"); ++i) {
      const std::string seq = "seq" + std::to_string(i);
      auto ids = ref.i32(seq + ".input_ids");
      SingleSequence one(**tp1, 16, int(ids.size()), DType::kBF16);
      SingleSequence many(**tpn, 16, int(ids.size()), DType::kBF16);
      auto a = one.step(ids, true), b = many.step(ids, true);
      const auto hf = ref.f32(seq + ".logits");
      const int64_t vocab = spec->vocab_size;
      const std::vector<bool> tied = near_tie_rows(*spec, *weights, ids, kRoutingTie);
      const int64_t n_tied = std::count(tied.begin(), tied.end(), true);
      const double vs_tp1 = nmse_of(b, a, vocab, tied), vs_ref = nmse_of(b, hf, vocab, tied);
      const double agree = agreement(b, a, vocab);
      std::printf(
          "%s tp %d %s: nmse vs tp 1 %.3g, vs HF %.3g (tp 1 vs HF %.3g; over %zu of %zu rows: %lld "
          "near-tie "
          "routings left out, all rows vs tp 1 %.3g), argmax agreement with tp 1 %.3f\n",
          c.name.c_str(), tp, seq.c_str(), vs_tp1, vs_ref, nmse_of(a, hf, vocab, tied),
          ids.size() - size_t(n_tied), ids.size(), (long long)n_tied, nmse_of(b, a), agree);
      EXPECT_LE(n_tied, int64_t(ids.size()) / 2)
          << c.name << " " << seq << ": too many near-tie routings to test";
      EXPECT_LT(vs_tp1, 5e-4) << c.name << " tp " << tp << " " << seq;
      EXPECT_LT(vs_ref, 5e-4) << c.name << " tp " << tp << " " << seq;
      EXPECT_GE(agree, 0.9) << c.name << " tp " << tp << " " << seq;
      expect_sampling_matches_logits(**tpn, ids, b,
                                     c.name + " tp " + std::to_string(tp) + " " + seq);
    }
  }
}

// Filter by model: --gtest_filter='*/house_mla' (a device call's carry holds one house model).
INSTANTIATE_TEST_SUITE_P(
    Models, TpParity,
    ::testing::Values(Case{"house-llama", shared_dir() + "/models/house-llama",
                           shared_dir() + "/fixtures/house-llama", true},
                      Case{"house-mla", shared_dir() + "/models/house-mla",
                           shared_dir() + "/fixtures/house-mla", true},
                      Case{"llama-gqa", shared_dir() + "/fixtures/tiny/llama-gqa",
                           shared_dir() + "/fixtures/tiny/llama-gqa", false},
                      Case{"deepseek-v3-mla-moe",
                           shared_dir() + "/fixtures/tiny/deepseek-v3-mla-moe",
                           shared_dir() + "/fixtures/tiny/deepseek-v3-mla-moe", false}),
    [](const ::testing::TestParamInfo<Case>& info) {
      std::string n = info.param.name;
      std::replace(n.begin(), n.end(), '-', '_');
      return n;
    });

// A Llama-3.1-8B-shaped model (its config, `layers` layers) with deterministic random bf16
// weights written to `dir`: the ranks must load the same values tp 1 does, so the values live
// in the checkpoint (uniform ±0.035, norms near 1). About 1.5 B parameters (3 GB) at 2 layers.
void write_random_llama(const std::string& config_path, const std::string& dir, int layers) {
  std::filesystem::create_directories(dir);
  nlohmann::json c = nlohmann::json::parse(std::ifstream(config_path));
  c["num_hidden_layers"] = layers;
  std::ofstream(dir + "/config.json") << c.dump(2);
  auto spec = load_model_spec(dir);
  ASSERT_TRUE(spec.ok()) << spec.status().to_string();
  const std::vector<CheckpointTensor> t = checkpoint_tensors(*spec);  // all bf16 for this config
  std::ofstream f(dir + "/model.safetensors", std::ios::binary | std::ios::trunc);
  write_safetensors_header(f, t);
  uint64_t state = 0x9E3779B97F4A7C15ull;
  std::vector<uint16_t> buf;
  for (const CheckpointTensor& ct : t) {
    ASSERT_EQ(std::string(ct.dtype), "BF16") << ct.name;
    const bool norm = ct.name.find("norm") != std::string::npos;
    buf.resize(size_t(shape_numel(ct.shape)));
    for (auto& v : buf) {
      state += 0x9E3779B97F4A7C15ull;  // splitmix64
      uint64_t z = state;
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      z ^= z >> 31;
      const float u = float(z >> 40) / float(1 << 24) * 2.0f - 1.0f;  // [-1, 1)
      v = f32_to_bf16(norm ? 1.0f + 0.1f * u : 0.035f * u);
    }
    f.write(reinterpret_cast<const char*>(buf.data()), std::streamsize(buf.size() * 2));
  }
}

TEST(TpParityRandom, Llama31_8BShapedRandomModelMatchesTp1) {
  int gpus = 0;
  ASSERT_EQ(cudaGetDeviceCount(&gpus), cudaSuccess);
  if (gpus < 2) GTEST_SKIP() << "needs 2+ GPUs, " << gpus << " visible";
  const std::string dir = "/tmp/strata_tp_llama8b_random";
  write_random_llama(shared_dir() + "/configs/llama-3.1-8b/config.json", dir, 2);
  auto spec = load_model_spec(dir);
  ASSERT_TRUE(spec.ok()) << spec.status().to_string();
  auto weights = WeightStore::open(dir, spec->quant);
  ASSERT_TRUE(weights.ok()) << weights.status().to_string();
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  std::vector<int32_t> ids(96);
  for (size_t i = 0; i < ids.size(); ++i)
    ids[i] = int32_t((i * 7919 + 13) % size_t(spec->vocab_size));
  std::vector<float> ref;
  {
    auto backend1 = make_cuda_backend();
    auto tp1 = create_model(*spec, *weights, *backend1);
    ASSERT_TRUE(tp1.ok()) << tp1.status().to_string();
    SingleSequence one(**tp1, 16, int(ids.size()), DType::kBF16);
    ref = one.step(ids, true);
  }
  for (int tp = 2; tp <= std::min(gpus, 8); tp *= 2) {
    const TpConfig config{.tp_size = tp, .device = Device::kCuda};
    auto factory = make_tp_rank_factory(config);
    ASSERT_TRUE(factory.ok()) << factory.status().to_string();
    std::unique_ptr<Backend> backend0;
    auto tpn = create_tp_model(*spec, *weights, config, *factory, &backend0);
    ASSERT_TRUE(tpn.ok()) << "tp " << tp << ": " << tpn.status().to_string();
    SingleSequence many(**tpn, 16, int(ids.size()), DType::kBF16);
    const double e = nmse_of(many.step(ids, true), ref);
    std::printf("llama-3.1-8b shape (2 layers, random) tp %d: nmse vs tp 1 %.3g\n", tp, e);
    EXPECT_LT(e, 5e-4) << "tp " << tp;
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace strata::testing
#endif  // STRATA_HAVE_NCCL
