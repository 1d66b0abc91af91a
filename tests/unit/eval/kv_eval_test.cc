// The eval-kv machinery on the house models: the paged runner against the Hugging Face
// reference logits (two sequences batched), and the evaluator's invariants (bf16 vs itself is
// exactly zero, fp8 is not, calibration finds the KV range).
#include "eval/kv_eval.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "eval/paged_runner.h"
#include "support/golden.h"

namespace strata {
namespace {

std::string model_dir(const char* name) {
  return std::string(STRATA_SHARED_DIR) + "/models/" + name;
}

TEST(PagedRunner, TwoBatchedSequencesMatchHuggingFace) {
  auto be = make_cpu_backend();
  auto model = load_model(model_dir("house-llama"), *be);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  testing::Reference ref(std::string(STRATA_SHARED_DIR) +
                         "/fixtures/house-llama/reference.safetensors");
  ASSERT_TRUE(ref.ok());
  KvCacheConfig exact = reference_kv_config((*model)->spec());
  exact.dtype = DType::kF32;
  PagedRunner run(**model, exact, 4, 2, 64);
  const std::vector<int32_t> a = ref.i32("seq0.input_ids"), b = ref.i32("seq1.input_ids");
  const int64_t vocab = (*model)->spec().vocab_size;
  std::vector<float> la, lb;
  // Chunks of 5 tokens from both sequences in each step.
  for (size_t i = 0; i < std::max(a.size(), b.size()); i += 5) {
    std::vector<std::pair<int, std::vector<int32_t>>> chunks;
    if (i < a.size())
      chunks.push_back({0, std::vector<int32_t>(a.begin() + long(i),
                                                a.begin() + long(std::min(a.size(), i + 5)))});
    if (i < b.size())
      chunks.push_back({1, std::vector<int32_t>(b.begin() + long(i),
                                                b.begin() + long(std::min(b.size(), i + 5)))});
    const std::vector<float> l = run.step(chunks, true);
    size_t off = 0;
    for (const auto& [seq, ids] : chunks) {
      auto& dst = seq == 0 ? la : lb;
      dst.insert(dst.end(), l.begin() + long(off),
                 l.begin() + long(off + ids.size() * size_t(vocab)));
      off += ids.size() * size_t(vocab);
    }
  }
  EXPECT_LT(testing::rel_max_error(la, ref.f32("seq0.logits")), 1e-4);
  EXPECT_LT(testing::rel_max_error(lb, ref.f32("seq1.logits")), 1e-4);
  EXPECT_EQ(run.greedy(0, ref.i32("greedy0.prompt_ids"), 32, 7), ref.i32("greedy0.output_ids"));
}

class KvEval : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    data_ = (std::filesystem::temp_directory_path() /
             ("strata_kv_eval_" + std::to_string(::getpid()) + ".jsonl"))
                .string();
    std::ifstream in(std::string(STRATA_SHARED_DIR) + "/data/heldout.jsonl");
    std::ofstream out(data_);
    std::string line;
    for (int i = 0; i < 12 && std::getline(in, line); ++i) out << line << "\n";
  }
  static void TearDownTestSuite() { std::filesystem::remove(data_); }

  std::unique_ptr<KvEvaluator> make(const char* model) {
    EvalKvOptions o{.model_path = model_dir(model),
                    .data_path = data_,
                    .max_tokens = 126,
                    .context_len = 64,
                    .chunk = 16,
                    .page_size = 4,
                    .noise_chunk = 7,
                    .free_run_prompts = 2,
                    .free_run_tokens = 8};
    auto e = KvEvaluator::create(o);
    EXPECT_TRUE(e.ok()) << e.status().to_string();
    return e.ok() ? std::move(e).value() : nullptr;
  }
  static std::string data_;
};
std::string KvEval::data_;

TEST_F(KvEval, Bf16IsExactlyTheReferenceAndFp8IsNot) {
  auto ev = make("house-llama");
  ASSERT_TRUE(ev);
  EXPECT_EQ(ev->data().windows.size(), 2u);  // ceil(126 / 63)
  auto bf16 = ev->resolve({.dtype = KvCacheDtype::kBF16});
  auto e4m3 = ev->resolve({.dtype = KvCacheDtype::kFp8E4M3});
  auto e5m2 = ev->resolve({.dtype = KvCacheDtype::kFp8E5M2});
  ASSERT_TRUE(bf16.ok() && e4m3.ok() && e5m2.ok());
  auto rr = ev->compare({{"bf16", *bf16}, {"e4m3", *e4m3}, {"e5m2", *e5m2}}, true, true);
  ASSERT_TRUE(rr.ok()) << rr.status().to_string();
  const auto& r = *rr;
  ASSERT_EQ(r.size(), 4u);
  EXPECT_EQ(r[0].label, "bf16-noise");
  EXPECT_EQ(r[1].metrics.tokens(), 2 * 63);
  EXPECT_EQ(r[1].metrics.mean_kl(), 0.0);  // same KV, same batching: bit-identical logits
  EXPECT_LT(r[0].metrics.mean_kl(), 1e-6);
  EXPECT_GT(r[2].metrics.mean_kl(), 1e-6);
  EXPECT_LT(r[2].metrics.mean_kl(), 0.5);
  EXPECT_GT(r[3].metrics.mean_kl(), r[2].metrics.mean_kl());  // 2 mantissa bits lose more than 3
  EXPECT_EQ(r[1].free_run.first_divergence, (std::vector<int>{8, 8}));
}

TEST_F(KvEval, CalibrationAndSensitivityOnMla) {
  auto ev = make("house-mla");
  ASSERT_TRUE(ev);
  const KvScales s = ev->calibrate(ev->data().windows, 128, DType::kFP8E4M3);
  ASSERT_EQ(s.k.size(), size_t(ev->spec().num_layers));
  for (float k : s.k) {
    EXPECT_GT(k, 0.0f);
    EXPECT_LT(k, 1.0f);  // amax of the MLA latent is far below 448
  }
  auto e4m3 = ev->resolve({.dtype = KvCacheDtype::kFp8E4M3});
  auto flash = ev->resolve({.dtype = KvCacheDtype::kFp8FlashMla});
  auto rope = ev->resolve({.dtype = KvCacheDtype::kFp8E4M3, .mla_rope_dtype = DType::kBF16});
  ASSERT_TRUE(e4m3.ok() && flash.ok() && rope.ok());
  auto sr = ev->layer_sensitivity(*e4m3, ev->data().windows, 63);
  ASSERT_TRUE(sr.ok()) << sr.status().to_string();
  const std::vector<double>& sens = *sr;
  ASSERT_EQ(sens.size(), size_t(ev->spec().num_layers));
  for (double x : sens) EXPECT_GT(x, 0.0);
  EXPECT_EQ(most_sensitive_layers({0.1, 0.5, 0.2, 0.4}, 2), (std::vector<int>{1, 3}));
  auto r = ev->compare({{"flash", *flash}, {"rope", *rope}}, false, false, nullptr, 2);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  for (const auto& c : *r) {
    EXPECT_GT(c.metrics.mean_kl(), 0.0) << c.label;
    EXPECT_LT(c.metrics.mean_kl(), 0.5) << c.label;
  }
}

}  // namespace
}  // namespace strata
