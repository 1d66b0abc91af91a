// Decode context parallelism at tp 8 on CPU ranks (arch/dcp.h). The fixtures have at most 5
// heads, too few for 8 ranks, so this test writes a random-weight MLA checkpoint of the tiny
// DeepSeek-V2-Lite-style fixture's shape with 8 and 16 heads (bench/cuda/bench_checkpoint.h's
// writer, into a temporary directory) and checks tp 8 with --dcp-size 8 (and 4: two DCP groups
// split off the tp group) against tp 1 of the same checkpoint: logits within 1e-5 (relative max
// error; the merge reorders the softmax sums in float32, so they are not bit-identical) and
// greedy continuations identical, token for token.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

// The random-checkpoint writer is a host-only header of bench/ (no include path of the test
// binaries names bench/: a relative include keeps their compile flags, and so ccache, as is).
#include "../../../bench/cuda/bench_checkpoint.h"
#include "arch/tp.h"
#include "dist/tensor_parallel.h"
#include "dist/tp_driver.h"
#include "model/config.h"
#include "model/weights.h"
#include "support/golden.h"
#include "support/temp_dir.h"

namespace strata::testing {
namespace {

// The fixture's config.json with `heads` attention heads, and a checkpoint of random weights
// (uniform in ±0.25: activations stay O(1) through the 64-wide model, so greedy picks are not
// near-ties) in dir/model.
std::string write_checkpoint(const TempDir& dir, int heads) {
  std::ifstream in(shared_dir() + "/fixtures/tiny/deepseek-v2lite-style/config.json");
  nlohmann::json config = nlohmann::json::parse(in);
  config["num_attention_heads"] = heads;
  config["num_key_value_heads"] = heads;
  const std::string config_path = dir.file("config_" + std::to_string(heads) + ".json");
  std::ofstream(config_path) << config.dump(2);
  const std::string model = dir.file("model_" + std::to_string(heads));
  write_random_checkpoint(config_path, model, /*seed=*/7, /*scale=*/0.25f);
  return model;
}

struct Case {
  int heads, tp, dcp;
};

TEST(DcpTp8, RandomCheckpointLogitsAndGreedyEqualTp1) {
  TempDir dir("strata_dcp_tp8");
  for (const Case& c : {Case{8, 8, 8}, Case{16, 8, 8}, Case{16, 8, 4}}) {
    SCOPED_TRACE(std::to_string(c.heads) + " heads, tp " + std::to_string(c.tp) + " dcp " +
                 std::to_string(c.dcp));
    const std::string model = write_checkpoint(dir, c.heads);
    auto spec = load_model_spec(model);
    ASSERT_TRUE(spec.ok()) << spec.status().to_string();
    ASSERT_EQ(spec->num_heads, c.heads);
    auto weights = WeightStore::open(model, spec->quant);
    ASSERT_TRUE(weights.ok()) << weights.status().to_string();
    auto backend1 = make_cpu_backend();
    auto tp1 = create_model(*spec, *weights, *backend1);
    ASSERT_TRUE(tp1.ok()) << tp1.status().to_string();
    const TpConfig config{.tp_size = c.tp, .dcp_size = c.dcp, .device = Device::kCpu};
    auto factory = make_tp_rank_factory(config);
    ASSERT_TRUE(factory.ok()) << factory.status().to_string();
    std::unique_ptr<Backend> backend0;
    auto tpn = create_tp_model(*spec, *weights, config, *factory, &backend0);
    ASSERT_TRUE(tpn.ok()) << tpn.status().to_string();

    // A prompt of 23 random tokens: a prefill of 16 (ranks' shards uneven: 16 is not a multiple
    // of 3 x dcp, the pool page being 3), 7 decode steps, all logits compared; then 10 greedy
    // tokens from the whole prompt on fresh caches.
    std::mt19937 rng(11);
    std::uniform_int_distribution<int32_t> tok(2, int32_t(spec->vocab_size) - 1);
    std::vector<int32_t> ids(23);
    for (int32_t& t : ids) t = tok(rng);
    const int kNew = 10, max_tokens = int(ids.size()) + kNew;
    {
      SingleSequence one(**tp1, 3 * c.dcp, max_tokens);
      SingleSequence many(**tpn, 3, max_tokens, DType::kF32, c.dcp);
      const std::vector<int32_t> head(ids.begin(), ids.begin() + 16);
      auto a = one.step(head, true), b = many.step(head, true);
      for (size_t t = head.size(); t < ids.size(); ++t) {
        auto a2 = one.step({ids[t]}, true), b2 = many.step({ids[t]}, true);
        a.insert(a.end(), a2.begin(), a2.end());
        b.insert(b.end(), b2.begin(), b2.end());
      }
      const double err = rel_max_error(b, a);
      std::printf("random %d-head MLA, tp %d dcp %d: rel max error vs tp 1 %.3g\n", c.heads, c.tp,
                  c.dcp, err);
      EXPECT_LT(err, 1e-5);
      EXPECT_GT(err, 0.0) << "bit-identical logits; is the DCP path running at all?";
    }
    SingleSequence one(**tp1, 3 * c.dcp, max_tokens);
    SingleSequence many(**tpn, 3, max_tokens, DType::kF32, c.dcp);
    const std::vector<int32_t> want = one.greedy(ids, kNew, 9), got = many.greedy(ids, kNew, 9);
    EXPECT_EQ(got, want);
    std::printf("  greedy tokens (tp 1 = tp %d dcp %d: %s):", c.tp, c.dcp,
                got == want ? "yes" : "NO");
    for (int32_t t : want) std::printf(" %d", t);
    std::printf("\n");
  }
}

}  // namespace
}  // namespace strata::testing
