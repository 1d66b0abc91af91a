// Prompt logprobs (GenerateRequest::prompt_logprobs_from: completions echo, SGLang's
// logprob_start_len) through the engine on the CUDA backend: the prefill's extra logits rows
// (gathered, projected, kept in full, downloaded) against the Hugging Face float32 logits of every
// position of tiny/llama-gqa, in one chunk and in chunks of 8 beside a sampled request.
//
// Bound (bf16 end to end, where model_parity_test's logits NMSE is < 5e-4): each prompt token's
// logprob within 0.05 of the reference's log-softmax, and the top alternative the reference's
// wherever its top two are 0.05 apart. The fixture has no tokenizer: the test writes a plain
// 512-token one (ids in, ids out) beside links to its weights.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <mutex>

#include "engine/engine.h"
#include "support/golden.h"
#include "support/temp_dir.h"

namespace strata::testing {
namespace {

// tiny/llama-gqa with a tokenizer.json of its 512 ids ("t0".."t511", BPE without merges).
std::string model_with_tokenizer(const TempDir& dir) {
  const std::string src = shared_dir() + "/fixtures/tiny/llama-gqa";
  for (const char* f : {"config.json", "generation_config.json", "model.safetensors"})
    std::filesystem::create_symlink(src + "/" + f, dir.file(f));
  std::string vocab;
  for (int i = 0; i < 512; ++i)
    vocab += (i ? ",\"t" : "\"t") + std::to_string(i) + "\":" + std::to_string(i);
  dir.write("tokenizer.json",
            R"({"version":"1.0","model":{"type":"BPE","vocab":{)" + vocab +
                R"(},"merges":[]},"added_tokens":[],"normalizer":null,"pre_tokenizer":null,)"
                R"("post_processor":null,"decoder":null})");
  return dir.str();
}

struct Scored {
  std::vector<TokenLogprobs> prompt_logprobs;
  int32_t from = -1;
  size_t tokens = 0;
};

// Runs every prompt at once on the CUDA engine (scored from 0, top 1, 2 new tokens greedy), plus
// a sampled request without scoring beside them.
std::vector<Scored> run(const std::string& model, int chunk,
                        const std::vector<std::vector<int32_t>>& prompts) {
  EngineConfig c;
  c.model_path = model;
  c.device = Device::kCuda;
  c.page_size = 4;
  c.chunked_prefill_size = chunk;
  c.mem_fraction_static = 0.3;
  c.max_total_tokens = 4096;
  auto e = Engine::create(c);
  EXPECT_TRUE(e.ok()) << e.status().to_string();
  if (!e.ok()) return {};
  std::vector<Scored> out(prompts.size() + 1);
  std::mutex mu;
  for (size_t i = 0; i <= prompts.size(); ++i) {
    GenerateRequest g;
    g.prompt_ids = i < prompts.size() ? prompts[i] : prompts[0];
    g.params = SamplingParams{
        .temperature = i < prompts.size() ? 0.0f : 0.8f, .max_new_tokens = 2, .ignore_eos = true};
    g.top_logprobs = 1;
    g.prompt_logprobs_from = i < prompts.size() ? 0 : -1;
    g.on_event = [&out, &mu, i](const StreamEvent& ev) {
      std::lock_guard<std::mutex> lk(mu);
      out[i].tokens += ev.token_ids.size();
      if (ev.prompt_logprobs_from > 0) {
        out[i].prompt_logprobs = ev.prompt_logprobs;
        out[i].from = ev.prompt_logprobs_from;
      }
    };
    auto id = (*e)->submit(std::move(g));
    EXPECT_TRUE(id.ok()) << id.status().to_string();
  }
  (*e)->wait_idle();
  return out;
}

TEST(PromptLogprobsParity, CudaEngineMatchesTheReference) {
  TempDir dir("prompt_logprobs");
  const std::string model = model_with_tokenizer(dir);
  Reference ref(shared_dir() + "/fixtures/tiny/llama-gqa/reference.safetensors");
  ASSERT_TRUE(ref.ok());
  const auto [prompts, logits] = reference_sequences(ref);
  for (int chunk : {4096, 8}) {
    const std::vector<Scored> out = run(model, chunk, prompts);
    ASSERT_EQ(out.size(), prompts.size() + 1);
    EXPECT_EQ(out.back().tokens, 2u);  // the sampled request beside them
    EXPECT_EQ(out.back().from, -1);
    for (size_t s = 0; s < prompts.size(); ++s) {
      const std::vector<int32_t>& ids = prompts[s];
      const int64_t vocab = int64_t(logits[s].size() / ids.size());
      ASSERT_EQ(out[s].from, 1) << "seq " << s;
      ASSERT_EQ(out[s].prompt_logprobs.size(), ids.size() - 1) << "seq " << s;
      EXPECT_EQ(out[s].tokens, 2u);
      double worst = 0;
      for (size_t pos = 1; pos < ids.size(); ++pos) {
        const float* row = logits[s].data() + (pos - 1) * size_t(vocab);
        const std::vector<double> want = log_softmax(row, vocab);
        auto lp = [&](int32_t id) { return want[size_t(id)]; };
        const TokenLogprobs& got = out[s].prompt_logprobs[pos - 1];
        const double err = std::abs(double(got.logprob) - lp(ids[pos]));
        worst = std::max(worst, err);
        EXPECT_LT(err, 0.05) << "seq " << s << " position " << pos;
        ASSERT_EQ(got.top.size(), 1u);
        std::vector<int32_t> order(static_cast<size_t>(vocab));
        for (int64_t v = 0; v < vocab; ++v) order[size_t(v)] = int32_t(v);
        std::partial_sort(order.begin(), order.begin() + 2, order.end(),
                          [&](int32_t a, int32_t b) { return row[a] > row[b]; });
        if (lp(order[0]) - lp(order[1]) > 0.05) {
          EXPECT_EQ(got.top[0].first, order[0]) << "seq " << s << " position " << pos;
        }
      }
      std::printf("chunk %d seq %zu: %zu prompt logprobs on cuda, max |error| %.3g\n", chunk, s,
                  ids.size() - 1, worst);
    }
  }
}

}  // namespace
}  // namespace strata::testing
