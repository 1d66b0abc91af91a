// Prompt logprobs (GenerateRequest::prompt_logprobs_from) under tensor parallelism, on the
// mission's model family: house-mla (MLA + MoE) through the engine at tp 1, tp 2 and tp 2 with
// decode context parallelism, the prompts scored in chunks of 8 as one batch, against the Hugging
// Face logits of every position. The vocab-parallel lm_head assembles every scored row on rank 0
// (DecoderModel::tp_logits), so each rank's slice must land in the right columns of each row.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <mutex>

#include "dist/tensor_parallel.h"
#include "engine/engine.h"
#include "support/golden.h"

namespace strata::testing {
namespace {

std::vector<std::vector<TokenLogprobs>> score(int tp, int dcp,
                                              const std::vector<std::vector<int32_t>>& prompts) {
  EngineConfig c;
  c.model_path = shared_dir() + "/models/house-mla";
  c.page_size = 2;
  c.chunked_prefill_size = 8;
  c.tp_size = tp;
  c.dcp_size = dcp;
  c.tp_allow_uneven = true;
  auto e = Engine::create(c, &tensor_parallel_runtime());
  EXPECT_TRUE(e.ok()) << e.status().to_string();
  if (!e.ok()) return {};
  std::vector<std::vector<TokenLogprobs>> out(prompts.size());
  std::mutex mu;
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerateRequest g;
    g.prompt_ids = prompts[i];
    g.params = SamplingParams{.temperature = 0.0f, .max_new_tokens = 2, .ignore_eos = true};
    g.top_logprobs = 2;
    g.prompt_logprobs_from = 0;
    g.on_event = [&out, &mu, i](const StreamEvent& ev) {
      std::lock_guard<std::mutex> lk(mu);
      if (ev.prompt_logprobs_from > 0) out[i] = ev.prompt_logprobs;
    };
    auto id = (*e)->submit(std::move(g));
    EXPECT_TRUE(id.ok()) << id.status().to_string();
  }
  (*e)->wait_idle();
  return out;
}

TEST(TpPromptLogprobs, EveryRankCountGivesTheReference) {
  Reference ref(shared_dir() + "/fixtures/house-mla/reference.safetensors");
  ASSERT_TRUE(ref.ok());
  const auto [prompts, logits] = reference_sequences(ref);
  for (auto [tp, dcp] : {std::pair{1, 1}, {2, 1}, {2, 2}}) {
    SCOPED_TRACE("tp " + std::to_string(tp) + " dcp " + std::to_string(dcp));
    const auto out = score(tp, dcp, prompts);
    ASSERT_EQ(out.size(), prompts.size());
    double worst = 0;
    for (size_t s = 0; s < prompts.size(); ++s) {
      const std::vector<int32_t>& ids = prompts[s];
      const int64_t vocab = int64_t(logits[s].size() / ids.size());
      ASSERT_EQ(out[s].size(), ids.size() - 1) << "seq " << s;
      for (size_t pos = 1; pos < ids.size(); ++pos) {
        const std::vector<double> want =
            log_softmax(logits[s].data() + (pos - 1) * size_t(vocab), vocab);
        const TokenLogprobs& got = out[s][pos - 1];
        const double err = std::abs(double(got.logprob) - want[size_t(ids[pos])]);
        worst = std::max(worst, err);
        EXPECT_LT(err, 1e-4) << "seq " << s << " position " << pos;
        ASSERT_EQ(got.top.size(), 2u);
        EXPECT_NEAR(got.top[0].second, want[size_t(got.top[0].first)], 1e-4);
        EXPECT_GE(got.top[0].second, got.top[1].second);
      }
    }
    std::printf("house-mla tp %d dcp %d: prompt logprobs of %zu prompts, max |error| %.2g\n", tp,
                dcp, prompts.size(), worst);
  }
}

}  // namespace
}  // namespace strata::testing
