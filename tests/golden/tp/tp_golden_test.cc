// Tensor parallelism on the CPU (in-process ranks, dist/tp_driver.h): at tp 2 and 4 the
// logits equal tp 1's within float32 reordering and the Hugging Face references as tightly as
// tp 1 does; the engine's greedy continuations with rank-0 broadcast equal tp 1's token for token.
//
// Tolerance: the ranks' partial sums are added in a different order than one rank's dot products,
// so logits differ from tp 1 by float32 rounding only: relative max error (max |a - b| / max |b|)
// below 2e-6 (measured 2.3e-7 .. 5.2e-7 at tp 2 and 4), and against the HF float32 reference
// below the 1e-4 the tp = 1 golden tests use (measured <= 1.3e-6).
#include <gtest/gtest.h>

#include "arch/tp.h"
#include "dist/tensor_parallel.h"
#include "dist/tp_driver.h"
#include "engine/engine.h"
#include "model/config.h"
#include "model/weights.h"
#include "support/engine_greedy.h"
#include "support/golden.h"

namespace strata::testing {
namespace {

struct Case {
  std::string name;
  std::string model_dir;
  std::string reference_dir;
  int tp;
  bool uneven;  // the house models have 5 heads: only the test-only uneven split shards them
};

std::vector<Case> cases() {
  const std::string s = shared_dir();
  std::vector<Case> c;
  for (int tp : {2, 4}) {
    c.push_back({"house_llama", s + "/models/house-llama", s + "/fixtures/house-llama", tp, true});
    c.push_back({"house_mla", s + "/models/house-mla", s + "/fixtures/house-mla", tp, true});
    for (const char* n : {"llama-gqa", "qwen2-bias", "deepseek-v3-mla-moe", "llama-tied-mha"}) {
      std::string name = n;
      for (char& ch : name)
        if (ch == '-') ch = '_';
      c.push_back({name, s + "/fixtures/tiny/" + n, s + "/fixtures/tiny/" + n, tp, false});
    }
  }
  c.push_back({"llama3_ropescaled", s + "/fixtures/tiny/llama3-ropescaled",
               s + "/fixtures/tiny/llama3-ropescaled", 4,
               false});  // one KV head replicated on 4 ranks
  return c;
}

class TpLogits : public ::testing::TestWithParam<Case> {};

TEST_P(TpLogits, EqualTp1AndTheReference) {
  const Case& c = GetParam();
  auto spec = load_model_spec(c.model_dir);
  ASSERT_TRUE(spec.ok()) << spec.status().to_string();
  auto weights = WeightStore::open(c.model_dir, spec->quant);
  ASSERT_TRUE(weights.ok()) << weights.status().to_string();
  auto backend1 = make_cpu_backend();
  auto tp1 = create_model(*spec, *weights, *backend1);
  ASSERT_TRUE(tp1.ok()) << tp1.status().to_string();
  const TpConfig config{
      .tp_size = c.tp, .device = Device::kCpu, .sharding = {.allow_uneven = c.uneven}};
  auto factory = make_tp_rank_factory(config);
  ASSERT_TRUE(factory.ok()) << factory.status().to_string();
  std::unique_ptr<Backend> backend0;
  auto tpn = create_tp_model(*spec, *weights, config, *factory, &backend0);
  ASSERT_TRUE(tpn.ok()) << tpn.status().to_string();
  Reference ref(c.reference_dir + "/reference.safetensors");
  ASSERT_TRUE(ref.ok());
  for (int i = 0; ref.has("seq" + std::to_string(i) + ".input_ids"); ++i) {
    const std::string seq = "seq" + std::to_string(i);
    auto ids = ref.i32(seq + ".input_ids");
    SingleSequence one(**tp1, 3, int(ids.size()));
    SingleSequence many(**tpn, 3, int(ids.size()));
    // Two steps: a prefill over most of the sequence, then the rest over the cached pages.
    const size_t cut = ids.size() * 2 / 3;
    std::vector<int32_t> head(ids.begin(), ids.begin() + long(cut)),
        tail(ids.begin() + long(cut), ids.end());
    auto a = one.step(head, true), b = many.step(head, true);
    auto a2 = one.step(tail, true), b2 = many.step(tail, true);
    a.insert(a.end(), a2.begin(), a2.end());
    b.insert(b.end(), b2.begin(), b2.end());
    const double vs_tp1 = rel_max_error(b, a), vs_ref = rel_max_error(b, ref.f32(seq + ".logits"));
    std::printf("%s tp %d %s: rel max error vs tp 1 %.3g, vs reference %.3g\n", c.name.c_str(),
                c.tp, seq.c_str(), vs_tp1, vs_ref);
    EXPECT_LT(vs_tp1, 2e-6) << seq;
    EXPECT_LT(vs_ref, 1e-4) << seq;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TpLogits, ::testing::ValuesIn(cases()), [](const auto& info) {
  return info.param.name + "_tp" + std::to_string(info.param.tp);
});

TEST(TpLoad, ErrorsNameTheFailingRankAndNobodyHangs) {
  const std::string dir = shared_dir() + "/models/house-llama";
  auto spec = load_model_spec(dir);
  ASSERT_TRUE(spec.ok());
  auto weights = WeightStore::open(dir, spec->quant);
  ASSERT_TRUE(weights.ok());
  // The strict plan refuses 5 heads over 2 ranks before any rank starts.
  TpConfig config{.tp_size = 2, .device = Device::kCpu, .sharding = {}};
  auto factory = make_tp_rank_factory(config);
  ASSERT_TRUE(factory.ok());
  std::unique_ptr<Backend> backend0;
  auto strict = create_tp_model(*spec, *weights, config, *factory, &backend0);
  ASSERT_FALSE(strict.ok());
  EXPECT_NE(strict.status().message().find("num_attention_heads 5"), std::string::npos)
      << strict.status().to_string();
  // Rank 2 of 3 cannot make its resources: the others (loaded, waiting at the barrier) stop too.
  config = TpConfig{.tp_size = 3, .device = Device::kCpu, .sharding = {.allow_uneven = true}};
  auto inner = make_tp_rank_factory(config);
  ASSERT_TRUE(inner.ok());
  RankFactory failing = [&](int r, const std::atomic<bool>& failed) -> StatusOr<RankResources> {
    if (r == 2) return unavailable("no device for rank 2");
    return (*inner)(r, failed);
  };
  auto broken = create_tp_model(*spec, *weights, config, failing, &backend0);
  ASSERT_FALSE(broken.ok());
  EXPECT_NE(broken.status().message().find("rank 2"), std::string::npos)
      << broken.status().to_string();
  EXPECT_NE(broken.status().message().find("no device"), std::string::npos)
      << broken.status().to_string();
}

// A communicator whose rank `fail_rank` fails at its `fail_at`-th all-reduce (a rank dying in the
// middle of a forward): it aborts the group, as the driver does when a rank's work fails.
class FailingComm : public Communicator {
 public:
  FailingComm(std::unique_ptr<Communicator> inner, int fail_rank, int fail_at)
      : inner_(std::move(inner)), fail_rank_(fail_rank), fail_at_(fail_at) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  void all_reduce_sum(const Tensor& x) override {
    if (rank() == fail_rank_ && ++calls_ == fail_at_)
      return inner_->abort(
          internal_error("rank {}: injected failure in all-reduce {}", rank(), calls_));
    inner_->all_reduce_sum(x);
  }
  void all_gather(const Tensor& in, const Tensor& out) override { inner_->all_gather(in, out); }
  Status broadcast_bytes(std::vector<uint8_t>& bytes, int root) override {
    return inner_->broadcast_bytes(bytes, root);
  }
  Status barrier() override { return inner_->barrier(); }
  void abort(const Status& reason) override { inner_->abort(reason); }
  Status status() const override { return inner_->status(); }

 private:
  std::unique_ptr<Communicator> inner_;
  int fail_rank_, fail_at_, calls_ = 0;
};

// A rank failing mid-forward stops the group: rank 0's forward ends the process with the failing
// rank's error instead of waiting for it forever.
TEST(TpFailureDeathTest, RankFailingMidForwardStopsTheGroupWithItsError) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::string dir = shared_dir() + "/fixtures/tiny/llama-gqa";
  auto spec = load_model_spec(dir);
  ASSERT_TRUE(spec.ok());
  auto weights = WeightStore::open(dir, spec->quant);
  ASSERT_TRUE(weights.ok());
  const TpConfig config{.tp_size = 2, .device = Device::kCpu};
  auto inner = make_tp_rank_factory(config);
  ASSERT_TRUE(inner.ok());
  RankFactory failing = [&](int r, const std::atomic<bool>& failed) -> StatusOr<RankResources> {
    STRATA_ASSIGN_OR_RETURN(RankResources res, (*inner)(r, failed));
    res.comm = std::make_unique<FailingComm>(std::move(res.comm), /*fail_rank=*/1, /*fail_at=*/3);
    return res;
  };
  EXPECT_DEATH(
      {
        std::unique_ptr<Backend> backend0;
        auto model = create_tp_model(*spec, *weights, config, failing, &backend0);
        CHECK(model.ok());
        SingleSequence run(**model, 4, 8);
        run.step({1, 2, 3, 4}, true);
      },
      "tensor-parallel group of 2 ranks stopped: .*rank 1: injected failure");
}

// Counts the pool layout messages (kInitKv, first byte 1) rank 0 sends.
class InitCountingComm : public Communicator {
 public:
  InitCountingComm(std::unique_ptr<Communicator> inner, std::atomic<int>* inits)
      : inner_(std::move(inner)), inits_(inits) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  void all_reduce_sum(const Tensor& x) override { inner_->all_reduce_sum(x); }
  void all_gather(const Tensor& in, const Tensor& out) override { inner_->all_gather(in, out); }
  Status broadcast_bytes(std::vector<uint8_t>& bytes, int root) override {
    if (rank() == root && !bytes.empty() && bytes[0] == 1) ++*inits_;
    return inner_->broadcast_bytes(bytes, root);
  }
  Status barrier() override { return inner_->barrier(); }
  void abort(const Status& reason) override { inner_->abort(reason); }
  Status status() const override { return inner_->status(); }

 private:
  std::unique_ptr<Communicator> inner_;
  std::atomic<int>* inits_;
};

// The workers get a pool's layout and scales once, not every step, and again when rank 0's
// scales change; a worker then updates its pool's scales in place and keeps its cached K/V, so
// after a mid-sequence scale change tp 2 still equals tp 1 doing the same (measured <= 3.6e-7; a
// worker that re-allocated its pool measured 0.46-0.68, one that kept it without the new scales
// 0.15-0.33).
TEST(TpKvInit, SentOnceAndAgainWhenTheScalesChange) {
  const std::string dir = shared_dir() + "/fixtures/tiny/llama-gqa";
  auto spec = load_model_spec(dir);
  ASSERT_TRUE(spec.ok());
  auto weights = WeightStore::open(dir, spec->quant);
  ASSERT_TRUE(weights.ok());
  auto backend1 = make_cpu_backend();
  auto tp1 = create_model(*spec, *weights, *backend1);
  ASSERT_TRUE(tp1.ok()) << tp1.status().to_string();
  const TpConfig config{.tp_size = 2, .device = Device::kCpu};
  auto inner = make_tp_rank_factory(config);
  ASSERT_TRUE(inner.ok());
  std::atomic<int> inits{0};
  RankFactory counting = [&](int r, const std::atomic<bool>& failed) -> StatusOr<RankResources> {
    STRATA_ASSIGN_OR_RETURN(RankResources res, (*inner)(r, failed));
    res.comm = std::make_unique<InitCountingComm>(std::move(res.comm), &inits);
    return res;
  };
  std::unique_ptr<Backend> backend0;
  auto tp2 = create_tp_model(*spec, *weights, config, counting, &backend0);
  ASSERT_TRUE(tp2.ok()) << tp2.status().to_string();
  SingleSequence one(**tp1, 4, 16, DType::kFP8E4M3), two(**tp2, 4, 16, DType::kFP8E4M3);
  // The same step on both: tp 2's logits equal tp 1's (fp8 K/V, as the pools are).
  auto step_both = [&](const std::vector<int32_t>& ids, const std::string& what) {
    const double err = rel_max_error(two.step(ids, true), one.step(ids, true));
    std::printf("tp 2 vs tp 1, %s: rel max error %.3g\n", what.c_str(), err);
    EXPECT_LT(err, 1e-5) << what;
  };
  auto set_scales_both = [&](int layer, float k, float v) {
    one.kv().set_scales(layer, k, v);
    two.kv().set_scales(layer, k, v);
  };
  const std::vector<int32_t> ids = {1, 5, 9, 13, 17, 21, 25, 29, 33, 37};
  for (int i = 0; i < 6; ++i) {  // a prefill and decodes: one init message
    const std::vector<int32_t> part = i == 0 ? std::vector<int32_t>(ids.begin(), ids.begin() + 5)
                                             : std::vector<int32_t>{ids[size_t(4 + i)]};
    step_both(part, "step " + std::to_string(i));
  }
  EXPECT_EQ(inits.load(), 1);
  set_scales_both(spec->num_layers - 1, 2.0f, 0.5f);  // mid-sequence: 10 tokens cached
  step_both({41, 45}, "two tokens after the last layer's scales changed");
  EXPECT_EQ(inits.load(), 2);
  step_both({49}, "a decode after that");
  EXPECT_EQ(inits.load(), 2);
  set_scales_both(0, 1.0f, 0.5f);  // the v scale alone
  step_both({53}, "a decode after layer 0's v scale changed");
  EXPECT_EQ(inits.load(), 3);
}

// Greedy continuations through the engine: rank 0 schedules and broadcasts each BatchPlan.
std::vector<std::vector<int32_t>> engine_greedy(const std::string& model, int tp,
                                                const std::vector<std::vector<int32_t>>& prompts,
                                                int new_tokens) {
  EngineConfig c;
  c.model_path = shared_dir() + "/models/" + model;
  c.page_size = 4;
  c.chunked_prefill_size = 8;  // prompts prefill in several chunks, batched with decodes
  c.tp_size = tp;
  c.tp_allow_uneven = true;
  auto e = Engine::create(c, &tensor_parallel_runtime());
  EXPECT_TRUE(e.ok()) << e.status().to_string();
  if (!e.ok()) return {};
  return testing::greedy_tokens(**e, prompts, new_tokens);
}

TEST(TpEngine, GreedyContinuationsEqualTp1) {
  for (const char* model : {"house-llama", "house-mla"}) {
    Reference ref(shared_dir() + "/fixtures/" + model + "/reference.safetensors");
    std::vector<std::vector<int32_t>> prompts, expected;
    for (int i = 0; ref.has("greedy" + std::to_string(i) + ".prompt_ids"); ++i) {
      prompts.push_back(ref.i32("greedy" + std::to_string(i) + ".prompt_ids"));
      expected.push_back(ref.i32("greedy" + std::to_string(i) + ".output_ids"));
    }
    prompts.push_back(
        std::vector<int32_t>(prompts[0].begin(), prompts[0].begin() + 5));  // a short one
    const int kNew = 16;
    auto tp1 = engine_greedy(model, 1, prompts, kNew);
    auto tp2 = engine_greedy(model, 2, prompts, kNew);
    EXPECT_EQ(tp2, tp1) << model;
    for (size_t i = 0; i < expected.size() && i < tp2.size(); ++i)
      EXPECT_EQ(tp2[i], std::vector<int32_t>(expected[i].begin(), expected[i].begin() + kNew))
          << model << " " << i;
  }
}

}  // namespace
}  // namespace strata::testing
