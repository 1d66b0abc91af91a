// DeepSeek-family (MLA + MoE) logits and greedy continuations against the Hugging Face references:
// the tiny random-weight fixtures (q_lora + YaRN + group-limited sigmoid routing, no q_lora, INT4
// routed experts) and the trained house-mla model.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "support/golden.h"

namespace strata::testing {
namespace {

// Required by the acceptance criteria is 1e-3; the implementation lands near 1e-6, so hold it to
// a bound that still catches any real semantic difference.
constexpr double kMaxRelError = 1e-4;

struct Fixture {
  std::string name;
  std::string model_dir;
  std::string reference_dir;
};

std::vector<Fixture> fixtures() {
  const std::string s = shared_dir();
  std::vector<Fixture> f;
  for (const char* n : {"deepseek-v3-mla-moe", "deepseek-v2lite-style", "deepseek-v3-int4-experts"})
    f.push_back({n, s + "/fixtures/tiny/" + n, s + "/fixtures/tiny/" + n});
  // Made in this repository by tests/fixtures/make_quant_fixtures.py (DeepSeek-V3 FP8 blocks).
  const std::string repo = STRATA_REPO_FIXTURES_DIR "/tiny/deepseek-v3-fp8-block";
  f.push_back({"deepseek-v3-fp8-block", repo, repo});
  f.push_back({"house-mla", s + "/models/house-mla", s + "/fixtures/house-mla"});
  return f;
}

std::unique_ptr<Model> load(Backend& backend, const std::string& dir) {
  auto m = load_model(dir, backend);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  return m.ok() ? std::move(m).value() : nullptr;
}

class DeepseekGolden : public ::testing::TestWithParam<Fixture> {
 protected:
  void SetUp() override {
    backend_ = make_cpu_backend();
    model_ = load(*backend_, GetParam().model_dir);
    ASSERT_NE(model_, nullptr);
    ref_ = std::make_unique<Reference>(GetParam().reference_dir + "/reference.safetensors");
    ASSERT_TRUE(ref_->ok());
  }
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Reference> ref_;
};

TEST_P(DeepseekGolden, KvLayoutHoldsLatentOnly) {
  const ModelSpec& s = model_->spec();
  const KvLayout l = model_->kv_layout();
  EXPECT_EQ(l.k_dim, s.mla.kv_lora_rank + s.mla.qk_rope_head_dim);
  EXPECT_EQ(l.v_dim, 0);
  EXPECT_EQ(l.num_layers, s.num_layers);
}

TEST_P(DeepseekGolden, LogitsMatchEveryPosition) {
  int checked = 0;
  for (int i = 0; ref_->has("seq" + std::to_string(i) + ".input_ids"); ++i) {
    const std::string seq = "seq" + std::to_string(i);
    auto ids = ref_->i32(seq + ".input_ids");
    auto expected = ref_->f32(seq + ".logits");
    SingleSequence run(*model_, /*page_size=*/3, int(ids.size()));
    auto logits = run.step(ids, /*all_logits=*/true);
    const double err = rel_max_error(logits, expected);
    EXPECT_LT(err, kMaxRelError) << GetParam().name << " " << seq;
    RecordProperty(seq + "_rel_max_error", std::to_string(err));
    std::printf("%s %s rel max error %.3g\n", GetParam().name.c_str(), seq.c_str(), err);
    ++checked;
  }
  EXPECT_GT(checked, 0);
}

// Prefill token by token (decode steps over a growing paged cache) must give the same logits.
TEST_P(DeepseekGolden, DecodeStepsMatch) {
  auto ids = ref_->i32("seq0.input_ids");
  auto expected = ref_->f32("seq0.logits");
  SingleSequence run(*model_, /*page_size=*/2, int(ids.size()));
  std::vector<float> logits;
  for (int32_t id : ids) {
    auto step = run.step({id}, true);
    logits.insert(logits.end(), step.begin(), step.end());
  }
  const double err = rel_max_error(logits, expected);
  std::printf("%s seq0 one token at a time: rel max error %.3g\n", GetParam().name.c_str(), err);
  EXPECT_LT(err, kMaxRelError);
}

TEST_P(DeepseekGolden, GreedyMatches) {
  int checked = 0;
  for (int i = 0; ref_->has("greedy" + std::to_string(i) + ".prompt_ids"); ++i) {
    const std::string g = "greedy" + std::to_string(i);
    auto prompt = ref_->i32(g + ".prompt_ids");
    auto expected = ref_->i32(g + ".output_ids");
    SingleSequence run(*model_, /*page_size=*/4, int(prompt.size() + expected.size()));
    // Prefill in chunks of 5 so chunked prefill over earlier pages is exercised too.
    EXPECT_EQ(run.greedy(prompt, int(expected.size()), 5), expected) << GetParam().name << " " << g;
    ++checked;
  }
  EXPECT_GT(checked, 0);
}

// Several sequences in one ForwardBatch: two steps, each carrying a chunk of every sequence, with
// the pages of all sequences interleaved in one pool.
TEST_P(DeepseekGolden, ManySequencesInOneBatch) {
  std::vector<std::vector<int32_t>> seqs;
  std::vector<std::vector<float>> expected;
  for (int i = 0; ref_->has("seq" + std::to_string(i) + ".input_ids"); ++i) {
    seqs.push_back(ref_->i32("seq" + std::to_string(i) + ".input_ids"));
    expected.push_back(ref_->f32("seq" + std::to_string(i) + ".logits"));
  }
  const int n_seqs = int(seqs.size());
  const int page_size = 2;
  int max_len = 0;
  for (const auto& s : seqs) max_len = std::max(max_len, int(s.size()));
  const int pages_per_seq = (max_len + page_size - 1) / page_size;
  KvLayout layout = model_->kv_layout();
  layout.page_size = page_size;
  layout.num_pages = n_seqs * pages_per_seq;
  auto kv = backend_->alloc_kv(layout);
  // Sequence s owns pages s, s + n_seqs, s + 2 n_seqs, ...: interleaved in the pool.
  std::vector<int32_t> page_indices;
  std::vector<int32_t> page_indptr = {0};
  for (int s = 0; s < n_seqs; ++s) {
    for (int p = 0; p < pages_per_seq; ++p) page_indices.push_back(s + p * n_seqs);
    page_indptr.push_back(int32_t(page_indices.size()));
  }
  const int64_t vocab = model_->spec().vocab_size;
  std::vector<std::vector<float>> got(static_cast<size_t>(n_seqs));
  std::vector<int> done(static_cast<size_t>(n_seqs), 0);
  for (int step = 0; step < 2; ++step) {
    std::vector<int32_t> tokens, positions, slots, q_indptr = {0}, kv_lens, rows;
    for (int s = 0; s < n_seqs; ++s) {
      const int len = int(seqs[size_t(s)].size());
      const int end = step == 0 ? (len + 1) / 3 : len;  // a first chunk, then the rest
      for (int p = done[size_t(s)]; p < end; ++p) {
        rows.push_back(int32_t(tokens.size()));
        tokens.push_back(seqs[size_t(s)][size_t(p)]);
        positions.push_back(p);
        slots.push_back(page_indices[size_t(page_indptr[size_t(s)] + p / page_size)] * page_size +
                        p % page_size);
      }
      done[size_t(s)] = end;
      q_indptr.push_back(int32_t(tokens.size()));
      kv_lens.push_back(end);
    }
    ForwardBatch b;
    b.token_ids = tokens.data();
    b.attn.num_seqs = n_seqs;
    b.attn.num_tokens = int(tokens.size());
    b.attn.page_size = page_size;
    b.attn.q_indptr = q_indptr.data();
    b.attn.kv_lens = kv_lens.data();
    b.attn.page_indptr = page_indptr.data();
    b.attn.page_indices = page_indices.data();
    b.attn.positions = positions.data();
    b.attn.slot_mapping = slots.data();
    b.logit_rows = rows.data();
    b.num_logit_rows = int(rows.size());
    std::vector<float> logits(rows.size() * size_t(vocab));
    model_->forward(b, *kv, logits.data());
    for (int s = 0; s < n_seqs; ++s)
      got[size_t(s)].insert(got[size_t(s)].end(), logits.begin() + q_indptr[size_t(s)] * vocab,
                            logits.begin() + q_indptr[size_t(s) + 1] * vocab);
  }
  for (int s = 0; s < n_seqs; ++s) {
    const double err = rel_max_error(got[size_t(s)], expected[size_t(s)]);
    std::printf("%s batched seq%d rel max error %.3g\n", GetParam().name.c_str(), s, err);
    EXPECT_LT(err, kMaxRelError) << "seq" << s;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, DeepseekGolden, ::testing::ValuesIn(fixtures()),
                         [](const auto& info) {
                           std::string n = info.param.name;
                           for (char& c : n)
                             if (c == '-') c = '_';
                           return n;
                         });

// kimi_k25: the VL wrapper around a DeepSeek-V3 text model with INT4 routed experts. Rebuild the
// INT4 fixture as such a checkpoint (text weights under `language_model.`, a vision tower that
// must be ignored, the config under `text_config`) and expect the fixture's reference logits.
TEST(DeepseekGoldenKimi, K25WrapperLayout) {
  const std::string src = shared_dir() + "/fixtures/tiny/deepseek-v3-int4-experts";
  const std::string dir = ::testing::TempDir() + "/strata_kimi_k25_tiny";
  std::filesystem::create_directories(dir);
  nlohmann::json text;
  std::ifstream(src + "/config.json") >> text;
  nlohmann::json wrapper = {{"architectures", {"KimiK25ForConditionalGeneration"}},
                            {"model_type", "kimi_k25"},
                            {"quantization_config", text["quantization_config"]},
                            {"vision_config", {{"hidden_size", 8}}},
                            {"text_config", text}};
  std::ofstream(dir + "/config.json") << wrapper.dump(2);
  auto file = SafetensorsFile::open(src + "/model.safetensors");
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  std::vector<SafetensorsEntry> entries;
  for (const TensorInfo& t : (*file)->tensors()) {
    SafetensorsEntry e{.name = "language_model." + t.name,
                       .dtype = t.dtype,
                       .shape = t.shape,
                       .bytes = std::vector<uint8_t>(t.data, t.data + t.nbytes)};
    entries.push_back(std::move(e));
  }
  entries.push_back({.name = "vision_tower.patch_embed.weight",
                     .dtype = DType::kF32,
                     .shape = {2, 2},
                     .bytes = std::vector<uint8_t>(16, 0)});
  ASSERT_TRUE(write_safetensors(dir + "/model.safetensors", entries).ok());

  auto backend = make_cpu_backend();
  auto model = load(*backend, dir);
  ASSERT_NE(model, nullptr);
  EXPECT_EQ(model->spec().weight_prefix, "language_model.model.");
  Reference ref(src + "/reference.safetensors");
  auto ids = ref.i32("seq0.input_ids");
  SingleSequence run(*model, 4, int(ids.size()));
  const double err = rel_max_error(run.step(ids, true), ref.f32("seq0.logits"));
  std::printf("kimi_k25 wrapper of deepseek-v3-int4-experts: rel max error %.3g\n", err);
  EXPECT_LT(err, kMaxRelError);
  std::filesystem::remove_all(dir);
}

// YaRN far past original_max_position_embeddings (128): 400 random ids, logits everywhere.
TEST(DeepseekGoldenLong, TinyYarnPast128) {
  auto backend = make_cpu_backend();
  const std::string dir = shared_dir() + "/fixtures/tiny/deepseek-v3-mla-moe";
  auto model = load(*backend, dir);
  ASSERT_NE(model, nullptr);
  Reference ref(dir + "/reference-long.safetensors");
  auto ids = ref.i32("long0.input_ids");
  auto expected = ref.f32("long0.logits");
  SingleSequence run(*model, 16, int(ids.size()));
  // Two chunks: the second attends over a cache written by the first.
  std::vector<int32_t> a(ids.begin(), ids.begin() + 150), b(ids.begin() + 150, ids.end());
  auto logits = run.step(a, true);
  auto rest = run.step(b, true);
  logits.insert(logits.end(), rest.begin(), rest.end());
  const double err = rel_max_error(logits, expected);
  std::printf("deepseek-v3-mla-moe long (400 tokens, YaRN): rel max error %.3g\n", err);
  EXPECT_LT(err, kMaxRelError);
}

// house-mla long context: argmax at every position of 768 tokens, sampled logits, and a 64-token
// greedy continuation of a 400-token prompt.
TEST(DeepseekGoldenLong, HouseMla) {
  auto backend = make_cpu_backend();
  auto model = load(*backend, shared_dir() + "/models/house-mla");
  ASSERT_NE(model, nullptr);
  check_long_reference(*model, shared_dir() + "/fixtures/house-mla/reference-long.safetensors",
                       "house-mla", kMaxRelError);
}

}  // namespace
}  // namespace strata::testing
