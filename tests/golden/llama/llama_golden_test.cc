// Llama-family logits and greedy continuations against the Hugging Face references.
#include <gtest/gtest.h>

#include "support/golden.h"

namespace strata::testing {
namespace {

struct Fixture {
  std::string name;
  std::string model_dir;
  std::string reference_dir;
};

std::vector<Fixture> fixtures() {
  const std::string s = shared_dir();
  std::vector<Fixture> f;
  for (const char* n :
       {"llama-gqa", "llama-tied-mha", "llama3-ropescaled", "qwen2-bias", "qwen3-qknorm"})
    f.push_back({n, s + "/fixtures/tiny/" + n, s + "/fixtures/tiny/" + n});
  // Made in this repository by tests/fixtures/make_quant_fixtures.py (compressed-tensors W4A16).
  const std::string repo = STRATA_REPO_FIXTURES_DIR "/tiny/llama-w4a16";
  f.push_back({"llama-w4a16", repo, repo});
  f.push_back({"house-llama", s + "/models/house-llama", s + "/fixtures/house-llama"});
  return f;
}

class LlamaGolden : public ::testing::TestWithParam<Fixture> {
 protected:
  void SetUp() override {
    backend_ = make_cpu_backend();
    auto m = load_model(GetParam().model_dir, *backend_);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    model_ = std::move(m).value();
    ref_ = std::make_unique<Reference>(GetParam().reference_dir + "/reference.safetensors");
    ASSERT_TRUE(ref_->ok());
  }
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Reference> ref_;
};

TEST_P(LlamaGolden, LogitsMatchEveryPosition) {
  for (int i = 0; ref_->has("seq" + std::to_string(i) + ".input_ids"); ++i) {
    const std::string seq = "seq" + std::to_string(i);
    auto ids = ref_->i32(seq + ".input_ids");
    auto expected = ref_->f32(seq + ".logits");
    SingleSequence run(*model_, /*page_size=*/3, int(ids.size()));
    auto logits = run.step(ids, /*all_logits=*/true);
    const double err = rel_max_error(logits, expected);
    EXPECT_LT(err, 1e-4) << GetParam().name << " " << seq;
    RecordProperty(seq + "_rel_max_error", std::to_string(err));
    std::printf("%s %s rel max error %.3g\n", GetParam().name.c_str(), seq.c_str(), err);
  }
}

TEST_P(LlamaGolden, GreedyMatches) {
  for (int i = 0; ref_->has("greedy" + std::to_string(i) + ".prompt_ids"); ++i) {
    const std::string g = "greedy" + std::to_string(i);
    auto prompt = ref_->i32(g + ".prompt_ids");
    auto expected = ref_->i32(g + ".output_ids");
    SingleSequence run(*model_, /*page_size=*/4, int(prompt.size() + expected.size()));
    // Prefill in chunks of 5 so chunked prefill over earlier pages is exercised too.
    EXPECT_EQ(run.greedy(prompt, int(expected.size()), 5), expected) << GetParam().name << " " << g;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, LlamaGolden, ::testing::ValuesIn(fixtures()),
                         [](const auto& info) {
                           std::string n = info.param.name;
                           for (char& c : n)
                             if (c == '-') c = '_';
                           return n;
                         });

// house-llama long context: argmax at every position of 768 tokens, sampled logits, and a
// 64-token greedy continuation of a 400-token prompt.
TEST(LlamaGoldenLong, HouseLlama) {
  auto backend = make_cpu_backend();
  auto m = load_model(shared_dir() + "/models/house-llama", *backend);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  check_long_reference(**m, shared_dir() + "/fixtures/house-llama/reference-long.safetensors",
                       "house-llama", 1e-4);
}

}  // namespace
}  // namespace strata::testing
