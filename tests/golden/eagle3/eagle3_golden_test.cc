// The EAGLE-3 drafter's CPU forward (arch/eagle3.cc) against tools/eagle3_train.py's PyTorch
// forward on the committed house-llama drafter (tests/fixtures/eagle3/house-llama, made by
// bench/cuda/eagle3_train_run.sh): hidden states and draft logits of a prefill step and of a draft
// step fed its own hidden state, within float32 reordering (rel max error < 1e-4); and the
// drafter's loading errors.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "arch/decoder.h"
#include "arch/eagle3.h"
#include "arch/model.h"
#include "support/eagle3_check.h"
#include "support/golden.h"
#include "support/temp_dir.h"

namespace strata::testing {
namespace {

const std::string kDrafter = STRATA_REPO_FIXTURES_DIR "/eagle3/house-llama";
std::string target_dir() { return shared_dir() + "/models/house-llama"; }

TEST(Eagle3Golden, MatchesPyTorchReference) {
  auto backend = make_cpu_backend();
  auto d = Eagle3Drafter::load(kDrafter, *backend, nullptr, target_dir());
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  const Eagle3Errors e =
      check_eagle3_reference(**d, kDrafter + "/reference.safetensors", {0, 3, 7, 12}, DType::kF32);
  std::printf(
      "step 1: hidden %.3g logits %.3g argmax %.3f; step 2: hidden %.3g logits %.3g "
      "argmax %.3f\n",
      e.step1_hidden, e.step1_logits, e.step1_argmax, e.step2_hidden, e.step2_logits,
      e.step2_argmax);
  EXPECT_LT(e.step1_hidden, 1e-4);
  EXPECT_LT(e.step1_logits, 1e-4);
  EXPECT_LT(e.step2_hidden, 1e-4);
  EXPECT_LT(e.step2_logits, 1e-4);
  EXPECT_EQ(e.step1_argmax, 1.0);
  EXPECT_EQ(e.step2_argmax, 1.0);
}

// The target's table borrowed (DecoderModel::input_embedding) computes what the table read from the
// target's directory does.
TEST(Eagle3Golden, BorrowsTheTargetsEmbedding) {
  auto backend = make_cpu_backend();
  auto target = load_model(target_dir(), *backend);
  ASSERT_TRUE(target.ok()) << target.status().to_string();
  const auto* decoder = dynamic_cast<const DecoderModel*>(target->get());
  ASSERT_NE(decoder, nullptr);
  const Tensor* table = decoder->input_embedding();
  ASSERT_NE(table, nullptr);
  auto d = Eagle3Drafter::load(kDrafter, *backend, table, "");
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  const Eagle3Errors e =
      check_eagle3_reference(**d, kDrafter + "/reference.safetensors", {5}, DType::kF32);
  EXPECT_LT(e.step1_logits, 1e-4);
  EXPECT_LT(e.step2_logits, 1e-4);
}

TEST(Eagle3Golden, AuxLayersFromTheConfig) {
  auto spec = load_eagle3_spec(kDrafter);
  ASSERT_TRUE(spec.ok()) << spec.status().to_string();
  auto layers = eagle3_aux_layers(*spec, 8);
  ASSERT_TRUE(layers.ok());
  EXPECT_EQ(*layers, (std::vector<int>{1, 3, 4}));
}

// A copy of the fixture with one thing changed must be refused, naming what is wrong.
class Eagle3LoadErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* f : {"config.json", "model.safetensors"})
      std::filesystem::copy_file(kDrafter + "/" + f, dir_.str() + "/" + f);
    std::ifstream in(dir_.str() + "/config.json");
    config_ = nlohmann::json::parse(in);
  }
  std::string load_error(const nlohmann::json& config, const std::string& target) {
    std::ofstream(dir_.str() + "/config.json") << config.dump();
    auto backend = make_cpu_backend();
    auto d = Eagle3Drafter::load(dir_.str(), *backend, nullptr, target);
    return d.ok() ? "" : d.status().to_string();
  }
  TempDir dir_;
  nlohmann::json config_;
};

TEST_F(Eagle3LoadErrors, NamesTheProblem) {
  EXPECT_EQ(load_error(config_, target_dir()), "");
  EXPECT_NE(load_error(config_, "").find("no target embeddings"), std::string::npos);
  auto c = config_;
  c["num_hidden_layers"] = 2;
  EXPECT_NE(load_error(c, target_dir()).find("more than one decoder layer"), std::string::npos);
  c = config_;
  c["architectures"] = {"LlamaForCausalLM"};
  EXPECT_NE(load_error(c, target_dir()).find("not an EAGLE-3 drafter"), std::string::npos);
  c = config_;
  c["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = {1, 1, 4};
  EXPECT_NE(load_error(c, target_dir()).find("eagle_aux_hidden_state_layer_ids"),
            std::string::npos);
  c = config_;
  c["draft_vocab_size"] = int64_t(c["draft_vocab_size"]) + 1;  // lm_head's shape no longer fits
  EXPECT_NE(load_error(c, target_dir()).find("lm_head"), std::string::npos);
  c = config_;
  c["tie_word_embeddings"] = true;
  EXPECT_NE(load_error(c, target_dir()).find("tie_word_embeddings"), std::string::npos);
}

}  // namespace
}  // namespace strata::testing
