// Tensor parallelism on several GPUs (the issue-11 acceptance; skipped with fewer than 2 GPUs):
// at tp 2, 4 and 8 (as many as are visible) the CUDA logits match tp 1's on the same GPUs and the
// Hugging Face float32 references within bf16 tolerance.
//
// Bounds: bf16 end to end, and the ranks' partial sums are rounded to bf16 before NCCL adds them,
// so tp N differs from tp 1 by bf16 rounding: NMSE ‖tpN − tp1‖² / ‖tp1‖² < 5e-4 and against HF
// < 5e-4 (the single-GPU model parity bound), argmax agreement with tp 1 >= 90% of positions.
// The house models have 5 heads: they shard only with the uneven (test-only) plan.
#include <gtest/gtest.h>

#ifdef STRATA_HAVE_NCCL
#include <cuda_runtime.h>

#include <cstdio>

#include "arch/tp.h"
#include "engine/tp_driver.h"
#include "model/config.h"
#include "model/weights.h"
#include "support/golden.h"

namespace strata::testing {
namespace {

double nmse_of(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    num += double(a[i] - b[i]) * (a[i] - b[i]);
    den += double(b[i]) * b[i];
  }
  return den > 0 ? num / den : num;
}

double agreement(const std::vector<float>& a, const std::vector<float>& b, int64_t vocab) {
  const int64_t rows = int64_t(a.size()) / vocab;
  int64_t same = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const auto ra = a.begin() + r * vocab, rb = b.begin() + r * vocab;
    same += (std::max_element(ra, ra + vocab) - ra) == (std::max_element(rb, rb + vocab) - rb);
  }
  return rows > 0 ? double(same) / double(rows) : 1.0;
}

struct Case {
  std::string name, model_dir, reference_dir;
  bool uneven;
};

TEST(TpParity, LogitsMatchTp1AndReference) {
  int gpus = 0;
  ASSERT_EQ(cudaGetDeviceCount(&gpus), cudaSuccess);
  if (gpus < 2) GTEST_SKIP() << "needs 2+ GPUs, " << gpus << " visible";
  const std::string s = shared_dir();
  const std::vector<Case> cases = {
      {"house-llama", s + "/models/house-llama", s + "/fixtures/house-llama", true},
      {"house-mla", s + "/models/house-mla", s + "/fixtures/house-mla", true},
      {"llama-gqa", s + "/fixtures/tiny/llama-gqa", s + "/fixtures/tiny/llama-gqa", false},
      {"deepseek-v3-mla-moe", s + "/fixtures/tiny/deepseek-v3-mla-moe", s + "/fixtures/tiny/deepseek-v3-mla-moe", false},
  };
  for (const Case& c : cases) {
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
      const TpConfig config{.tp_size = tp, .device = "cuda", .sharding = {.allow_uneven = c.uneven}};
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
        const double vs_tp1 = nmse_of(b, a), vs_ref = nmse_of(b, ref.f32(seq + ".logits"));
        const double agree = agreement(b, a, spec->vocab_size);
        std::printf("%s tp %d %s: nmse vs tp 1 %.3g, vs HF %.3g, argmax agreement with tp 1 %.3f\n", c.name.c_str(),
                    tp, seq.c_str(), vs_tp1, vs_ref, agree);
        EXPECT_LT(vs_tp1, 5e-4) << c.name << " tp " << tp << " " << seq;
        EXPECT_LT(vs_ref, 5e-4) << c.name << " tp " << tp << " " << seq;
        EXPECT_GE(agree, 0.9) << c.name << " tp " << tp << " " << seq;
      }
    }
  }
}

}  // namespace
}  // namespace strata::testing
#endif  // STRATA_HAVE_NCCL
