// --tp-one-rank (backend/solo_comm.h): rank 0 of a tensor-parallel group run alone, every
// collective skipped and counted. What each count must be follows from the decoder's collectives
// (arch/decoder.cc): per forward, one all-reduce after the vocab-parallel embedding and one after
// each layer's attention and MLP, each of the step's [tokens, hidden] activations; one all-gather
// of the logits, [tokens, vocab / tp] from this rank.
#include <gtest/gtest.h>

#include <cmath>

#include "backend/solo_comm.h"
#include "dist/tp_driver.h"
#include "engine/engine.h"
#include "model/config.h"
#include "model/weights.h"
#include "support/golden.h"

namespace strata::testing {
namespace {

TEST(TpOneRank, CountsEveryCollectiveOfAForward) {
  const std::string dir =
      shared_dir() + "/fixtures/tiny/llama-gqa";  // 2 layers, hidden 64, vocab 512
  auto spec = load_model_spec(dir);
  ASSERT_TRUE(spec.ok()) << spec.status().to_string();
  auto weights = WeightStore::open(dir, spec->quant);
  ASSERT_TRUE(weights.ok()) << weights.status().to_string();
  const TpConfig config{.tp_size = 2, .device = Device::kCpu, .one_rank = true};
  auto factory = make_tp_rank_factory(config);
  ASSERT_TRUE(factory.ok()) << factory.status().to_string();
  std::unique_ptr<Backend> backend0;
  auto model = create_tp_model(*spec, *weights, config, *factory, &backend0);
  ASSERT_TRUE(model.ok()) << model.status().to_string();

  const int tokens = 7;
  const int64_t act = int64_t(dtype_size(backend0->activation_dtype()));
  SingleSequence seq(**model, 4, 16, backend0->activation_dtype());
  const SkippedCollectives before = skipped_collectives();
  std::vector<int32_t> ids = {3, 17, 5, 200, 9, 41, 300};
  const std::vector<float> logits = seq.step(ids, true);
  const SkippedCollectives s = skipped_collectives() - before;

  const int64_t layers = spec->num_layers, hidden = spec->hidden_size, vocab = spec->vocab_size;
  EXPECT_EQ(s.all_reduce_calls, 2 * layers + 1);
  EXPECT_EQ(s.all_reduce_bytes, (2 * layers + 1) * tokens * hidden * act);
  EXPECT_EQ(s.all_gather_calls, 1);
  EXPECT_EQ(s.all_gather_bytes, tokens * (vocab / 2) * act);
  EXPECT_GE(s.broadcast_calls, 1);  // the step's plan, sent to nobody

  // The gather put rank 0's vocab half in both ranks' slots: the logits' halves are equal and
  // finite (rank 0's own columns, computed on its shards).
  ASSERT_EQ(logits.size(), size_t(tokens * vocab));
  for (int t = 0; t < tokens; ++t)
    for (int64_t v = 0; v < vocab / 2; ++v) {
      const float a = logits[size_t(t * vocab + v)], b = logits[size_t(t * vocab + vocab / 2 + v)];
      ASSERT_TRUE(std::isfinite(a));
      ASSERT_EQ(a, b) << "token " << t << " column " << v;
    }
}

TEST(TpOneRank, NeedsMoreThanOneRank) {
  EngineConfig c;
  c.model_path = shared_dir() + "/models/house-llama";
  c.tp_one_rank = true;  // tp_size 1
  auto e = Engine::create(c);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("--tp-one-rank"), std::string::npos)
      << e.status().to_string();
}

}  // namespace
}  // namespace strata::testing
