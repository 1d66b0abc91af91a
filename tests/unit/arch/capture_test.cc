// The model runner's hidden-state capture (Model::set_capture, ForwardBatch::captured) on the CPU
// reference, house-llama (llama) and house-mla (deepseek: MLA + MoE):
//  - every layer's captured output equals the residual stream rebuilt from the Tracer's
//    intermediates (embedding + each layer's attention and MLP outputs), and the final-norm block
//    equals the traced final norm;
//  - capture over chunked prefill and decode steps equals one prefill over the same tokens;
//  - against Hugging Face's states (tests/fixtures/hidden_states/, made by
//    tests/fixtures/make_hidden_state_fixtures.py): seqN.layer.K and seqN.norm, float tolerance.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>

#include "support/golden.h"

namespace strata::testing {
namespace {

struct Case {
  std::string name;
};

class CaptureTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    backend_ = make_cpu_backend();
    auto m = load_model(shared_dir() + "/models/" + GetParam().name, *backend_);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    model_ = std::move(m).value();
    layers_ = model_->spec().num_layers;
    hidden_ = model_->spec().hidden_size;
    CaptureSpec spec;
    for (int l = 0; l < layers_; ++l) spec.layers.push_back(l);
    spec.final_norm = true;
    ASSERT_TRUE(model_->set_capture(spec, 512).ok());
    width_ = model_->capture_width();
    ASSERT_EQ(width_, int64_t(layers_ + 1) * hidden_);
  }
  // Column block `b` of captured rows [n, width] as [n, hidden].
  std::vector<float> block(const std::vector<float>& rows, int b) const {
    const size_t n = rows.size() / size_t(width_);
    std::vector<float> out(n * size_t(hidden_));
    for (size_t i = 0; i < n; ++i)
      std::copy_n(rows.begin() + long(i * size_t(width_) + size_t(b) * size_t(hidden_)), hidden_,
                  out.begin() + long(i * size_t(hidden_)));
    return out;
  }
  std::vector<int32_t> ids(int n) const {
    std::vector<int32_t> v(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) v[size_t(i)] = int32_t((i * 7919 + 13) % model_->spec().vocab_size);
    return v;
  }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
  int layers_ = 0;
  int64_t hidden_ = 0, width_ = 0;
};

TEST_P(CaptureTest, LayerOutputsEqualTheTracedResidualStream) {
  std::map<std::string, std::vector<float>> traced;
  model_->set_tracer([&](std::string_view name, int layer, const Tensor& t) {
    std::vector<float> v(size_t(t.numel()));
    backend_->download_f32(t, v.data());
    traced[std::string(name) + (layer >= 0 ? "." + std::to_string(layer) : "")] = std::move(v);
  });
  const std::vector<int32_t> tokens = ids(37);
  SingleSequence run(*model_, 4, int(tokens.size()));
  run.capture(width_);
  run.step(tokens, false);
  const std::vector<float> captured = run.captured();
  ASSERT_EQ(captured.size(), tokens.size() * size_t(width_));
  std::vector<float> residual = traced.at("embed");
  for (int l = 0; l < layers_; ++l) {
    const auto& attn = traced.at("attn_out." + std::to_string(l));
    const auto& mlp = traced.at("mlp_out." + std::to_string(l));
    for (size_t i = 0; i < residual.size(); ++i) residual[i] = (residual[i] + attn[i]) + mlp[i];
    const double err = rel_max_error(block(captured, l), residual);
    EXPECT_LT(err, 1e-5) << GetParam().name << " layer " << l;
  }
  EXPECT_EQ(block(captured, layers_), traced.at("final_norm")) << GetParam().name;
}

TEST_P(CaptureTest, ChunkedPrefillAndDecodeEqualOnePrefill) {
  const std::vector<int32_t> tokens = ids(29);
  SingleSequence whole(*model_, 4, int(tokens.size()));
  whole.capture(width_);
  whole.step(tokens, false);
  const std::vector<float> expected = whole.captured();

  SingleSequence steps(*model_, 4, int(tokens.size()));
  steps.capture(width_);
  std::vector<float> got;
  size_t at = 0;
  for (size_t chunk : {size_t(11), size_t(9)}) {  // two prefill chunks, then one token per step
    steps.step(std::vector<int32_t>(tokens.begin() + long(at), tokens.begin() + long(at + chunk)),
               false);
    got.insert(got.end(), steps.captured().begin(), steps.captured().end());
    at += chunk;
  }
  for (; at < tokens.size(); ++at) {
    steps.step({tokens[at]}, false);
    got.insert(got.end(), steps.captured().begin(), steps.captured().end());
  }
  EXPECT_LT(rel_max_error(got, expected), 1e-5) << GetParam().name;
}

TEST_P(CaptureTest, MatchesHuggingFaceHiddenStates) {
  const std::string path =
      STRATA_REPO_FIXTURES_DIR "/hidden_states/" + GetParam().name + ".safetensors";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " is not committed yet";
  Reference ref(path);
  ASSERT_TRUE(ref.ok());
  int checked = 0;
  for (const std::string seq : {"seq0", "seq1", "seq2", "long"}) {
    if (!ref.has(seq + ".input_ids")) continue;
    const std::vector<int32_t> tokens = ref.i32(seq + ".input_ids");
    SingleSequence run(*model_, 16, int(tokens.size()));
    run.capture(width_);
    run.step(tokens, false);
    const std::vector<float> captured = run.captured();
    for (int l = 0; l < layers_; ++l) {
      const double err =
          rel_max_error(block(captured, l), ref.f32(seq + ".layer." + std::to_string(l)));
      EXPECT_LT(err, 1e-4) << GetParam().name << " " << seq << " layer " << l;
    }
    const double err = rel_max_error(block(captured, layers_), ref.f32(seq + ".norm"));
    EXPECT_LT(err, 1e-4) << GetParam().name << " " << seq << " final norm";
    std::printf("%s %s: %d layers + final norm vs Hugging Face, final norm rel max error %.3g\n",
                GetParam().name.c_str(), seq.c_str(), layers_, err);
    ++checked;
  }
  EXPECT_GT(checked, 0);
}

INSTANTIATE_TEST_SUITE_P(HouseModels, CaptureTest,
                         ::testing::Values(Case{"house-llama"}, Case{"house-mla"}),
                         [](const auto& info) {
                           std::string n = info.param.name;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

}  // namespace
}  // namespace strata::testing
