// Decode context parallelism on NCCL ranks (issue 28; skipped where fewer GPUs are visible than a
// case's ranks): each rank of a DCP group holds 1/N of every sequence's latent KV on its own GPU,
// attends over its shard, and the partials meet by their log-sum-exp over NCCL (arch/dcp.h). At
// tp = dcp = 2, 4 and 8, and two DCP groups of 2 inside tp 4 (Communicator::split), the CUDA
// logits of a prefill of two thirds of each reference sequence and then one decode step a
// remaining token (pool pages of 3 tokens a rank: sequences cross pages and shards unevenly)
// match tp 1's on one GPU within the tensor-parallel bounds (tp_parity_test.cc: NMSE < 5e-4 over
// the rows whose MoE routing is not a float32 near-tie, argmax agreement >= 90%), and differ from
// the same ranks' logits without DCP (bit-identical logits would mean the DCP path never ran: its
// merge adds the softmax sums in another order). Models: house-mla (5 heads: the test-only uneven
// split), the tiny DeepSeek-V3-style and V2-Lite-style fixtures (4 heads: up to tp 4). The CPU
// twin of this test is tests/golden/tp/dcp_golden_test.cc.
#include <gtest/gtest.h>

#ifdef STRATA_HAVE_NCCL
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "arch/tp.h"
#include "dist/tp_driver.h"
#include "model/config.h"
#include "model/weights.h"
#include "parity/tp_compare.h"
#include "support/golden.h"

namespace strata::testing {
namespace {

struct Case {
  std::string name;
  std::string dir;  // model and reference
  int tp;
  int dcp;
  bool uneven;
};

std::vector<Case> cases() {
  const std::string s = shared_dir();
  std::vector<Case> c;
  for (int tp : {2, 4, 8}) {
    c.push_back({"house_mla", s + "/fixtures/house-mla", tp, tp, true});
    if (tp <= 4)
      for (const char* n : {"deepseek-v3-mla-moe", "deepseek-v2lite-style"}) {
        std::string name = n;
        std::replace(name.begin(), name.end(), '-', '_');
        c.push_back({name, s + "/fixtures/tiny/" + n, tp, tp, false});
      }
  }
  c.push_back({"deepseek_v3_mla_moe", s + "/fixtures/tiny/deepseek-v3-mla-moe", 4, 2, false});
  c.push_back({"house_mla", s + "/fixtures/house-mla", 4, 2, true});
  return c;
}

std::string model_dir(const Case& c) {
  return c.name == "house_mla" ? shared_dir() + "/models/house-mla" : c.dir;
}

// Every row's logits of `ids` through `model`: the first `cut` tokens as one prefill, then one
// decode step a token.
std::vector<float> prefill_then_decode(Model& model, const std::vector<int32_t>& ids, size_t cut,
                                       int page, int dcp) {
  SingleSequence seq(model, page, int(ids.size()), DType::kBF16, dcp);
  std::vector<int32_t> head(ids.begin(), ids.begin() + long(cut));
  std::vector<float> logits = seq.step(head, true);
  for (size_t t = cut; t < ids.size(); ++t) {
    const std::vector<float> row = seq.step({ids[t]}, true);
    logits.insert(logits.end(), row.begin(), row.end());
  }
  return logits;
}

constexpr double kRoutingTie = 3e-3;  // tp_parity_test.cc's: ~3 bf16 ulps of a score near 0.5

class DcpTpParity : public ::testing::TestWithParam<Case> {};

TEST_P(DcpTpParity, LogitsMatchTp1) {
  const Case& c = GetParam();
  int gpus = 0;
  ASSERT_EQ(cudaGetDeviceCount(&gpus), cudaSuccess);
  if (gpus < c.tp) GTEST_SKIP() << "needs " << c.tp << " GPUs, " << gpus << " visible";
  auto spec = load_model_spec(model_dir(c));
  ASSERT_TRUE(spec.ok()) << spec.status().to_string();
  auto weights = WeightStore::open(model_dir(c), spec->quant);
  ASSERT_TRUE(weights.ok()) << weights.status().to_string();
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  auto backend1 = make_cuda_backend();
  auto tp1 = create_model(*spec, *weights, *backend1);
  ASSERT_TRUE(tp1.ok()) << tp1.status().to_string();
  auto make = [&](int dcp, std::unique_ptr<Backend>* backend0) {
    const TpConfig config{.tp_size = c.tp,
                          .dcp_size = dcp,
                          .device = Device::kCuda,
                          .sharding = {.allow_uneven = c.uneven}};
    auto factory = make_tp_rank_factory(config);
    CHECK_MSG(factory.ok(), "{}", factory.status().to_string());
    return create_tp_model(*spec, *weights, config, *factory, backend0);
  };
  std::unique_ptr<Backend> backend_dcp, backend_tp;
  auto with_dcp = make(c.dcp, &backend_dcp);
  ASSERT_TRUE(with_dcp.ok()) << c.name << ": " << with_dcp.status().to_string();
  auto without = make(1, &backend_tp);
  ASSERT_TRUE(without.ok()) << c.name << ": " << without.status().to_string();
  Reference ref(c.dir + "/reference.safetensors");
  ASSERT_TRUE(ref.ok());
  const int64_t vocab = spec->vocab_size;
  for (int i = 0; ref.has("seq" + std::to_string(i) + ".input_ids"); ++i) {
    const std::string seq = "seq" + std::to_string(i);
    const auto ids = ref.i32(seq + ".input_ids");
    const size_t cut = ids.size() * 2 / 3 + 1;
    const auto a = prefill_then_decode(**tp1, ids, cut, 3 * c.dcp, 1);
    const auto b = prefill_then_decode(**with_dcp, ids, cut, 3, c.dcp);
    const auto plain = prefill_then_decode(**without, ids, cut, 3 * c.dcp, 1);
    const std::vector<bool> tied = near_tie_rows(*spec, *weights, ids, kRoutingTie);
    const int64_t n_tied = std::count(tied.begin(), tied.end(), true);
    const double vs_tp1 = nmse_of(b, a, vocab, tied), agree = agreement(b, a, vocab);
    std::printf(
        "%s tp %d dcp %d %s: nmse vs tp 1 %.3g (tp %d without dcp %.3g; %lld near-tie "
        "routings left out of %zu rows), argmax agreement %.3f\n",
        c.name.c_str(), c.tp, c.dcp, seq.c_str(), vs_tp1, c.tp, nmse_of(plain, a, vocab, tied),
        (long long)n_tied, ids.size(), agree);
    EXPECT_LE(n_tied, int64_t(ids.size()) / 2) << seq << ": too many near-tie routings to test";
    EXPECT_LT(vs_tp1, 5e-4) << seq;
    EXPECT_GE(agree, 0.9) << seq;
    EXPECT_NE(b, plain) << seq << ": the same bits as tp " << c.tp
                        << " without DCP; is the DCP path running at all?";
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, DcpTpParity, ::testing::ValuesIn(cases()), [](const auto& info) {
  return info.param.name + "_tp" + std::to_string(info.param.tp) + "_dcp" +
         std::to_string(info.param.dcp);
});

}  // namespace
}  // namespace strata::testing
#endif  // STRATA_HAVE_NCCL
