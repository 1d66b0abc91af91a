// house-mla through the engine on the CUDA backend (issue 22): the path `strata generate --device
// cuda` takes, with the KV layouts the engine builds (rope_dim set: the MLA writer and row
// formats of mla.cu) and batched decode steps replayed from CUDA graphs.
//
// What must hold: for every KV cache dtype the engine offers an MLA model (bf16, fp8_e4m3 with a
// bf16 rope part, fp8_e5m2, fp8_flashmla), a batch of prompts generates every requested token
// and no mla_attention call runs on the CPU twin (EngineStats::cpu_fallback_ops, the counter
// behind strata_cpu_fallback_ops_total{op="mla_attention"}); one request at a time, graphs on
// and off give the same tokens (the same launches, replayed). How far the fp8 caches' tokens
// stay with bf16's is printed (fp8 rounding may move a near-tie; mla_backend_parity_test bounds
// the fp8 attention itself).
#include <gtest/gtest.h>

#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "support/engine_greedy.h"
#include "support/golden.h"

namespace strata::testing {
namespace {

constexpr int kNewTokens = 24;

struct Outcome {
  std::vector<std::vector<int32_t>> tokens;
  int64_t mla_fallbacks = -1;  // -1: the backend's table has no mla_attention row
};

Outcome generate(const std::string& kv_dtype, const std::string& rope_dtype,
                 std::optional<int> graph_max_bs, bool one_at_a_time,
                 const std::vector<std::vector<int32_t>>& prompts) {
  EngineConfig c;
  c.model_path = shared_dir() + "/models/house-mla";
  c.device = Device::kCuda;
  const std::optional<KvCacheDtype> kv = enum_from_name<KvCacheDtype>(kv_dtype);
  EXPECT_TRUE(kv.has_value()) << kv_dtype;
  if (!kv) return {};
  c.kv_cache_dtype = *kv;
  if (!rope_dtype.empty()) c.kv_mla_rope_dtype = enum_from_name<DType>(rope_dtype);
  EXPECT_EQ(c.kv_mla_rope_dtype.has_value(), !rope_dtype.empty()) << rope_dtype;
  c.mem_fraction_static = 0.5;
  c.max_total_tokens = 8192;
  c.cuda_graph_max_bs = graph_max_bs;
  auto e = Engine::create(c);
  EXPECT_TRUE(e.ok()) << kv_dtype << ": " << e.status().to_string();
  if (!e.ok()) return {};
  Outcome out;
  out.tokens = greedy_tokens(**e, prompts, kNewTokens, one_at_a_time);
  for (const auto& [op, n] : (*e)->stats().cpu_fallback_ops)
    if (op == "mla_attention") out.mla_fallbacks = n;
  return out;
}

std::vector<std::vector<int32_t>> fixture_prompts() {
  Reference ref(shared_dir() + "/fixtures/house-mla/reference.safetensors");
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; ref.has("seq" + std::to_string(i) + ".input_ids"); ++i)
    prompts.push_back(ref.i32("seq" + std::to_string(i) + ".input_ids"));
  for (int i = 0; ref.has("greedy" + std::to_string(i) + ".prompt_ids"); ++i)
    prompts.push_back(ref.i32("greedy" + std::to_string(i) + ".prompt_ids"));
  Reference long_ref(shared_dir() + "/fixtures/house-mla/reference-long.safetensors");
  prompts.push_back(long_ref.i32("longgreedy0.prompt_ids"));
  return prompts;
}

TEST(MlaEngine, HouseMlaGeneratesWithoutMlaFallbackOnEveryKvDtype) {
  const auto prompts = fixture_prompts();
  ASSERT_GE(prompts.size(), 4u);
  std::vector<std::vector<int32_t>> bf16;
  struct Kv {
    const char* dtype;
    const char* rope;
  };
  for (const Kv kv :
       {Kv{"auto", ""}, Kv{"fp8_e4m3", "bf16"}, Kv{"fp8_e5m2", ""}, Kv{"fp8_flashmla", ""}}) {
    SCOPED_TRACE(std::string(kv.dtype) + " rope " + kv.rope);
    const Outcome o = generate(kv.dtype, kv.rope, std::nullopt, false, prompts);
    ASSERT_EQ(o.tokens.size(), prompts.size());
    int same = 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(o.tokens[i].size(), size_t(kNewTokens)) << "prompt " << i;
      if (!bf16.empty()) same += o.tokens[i] == bf16[i];
    }
    if (bf16.empty()) bf16 = o.tokens;
    std::printf(
        "house-mla engine, kv %s%s%s: %zu prompts x %d tokens batched, mla_attention CPU "
        "fallbacks %lld; outputs equal to bf16 KV's: %d/%zu\n",
        kv.dtype, *kv.rope ? ", rope " : "", kv.rope, prompts.size(), kNewTokens,
        (long long)o.mla_fallbacks, same, prompts.size());
    EXPECT_EQ(o.mla_fallbacks, 0);
  }
}

TEST(MlaEngine, HouseMlaGraphsDoNotChangeTokens) {
  const auto prompts = fixture_prompts();
  for (const char* dtype : {"auto", "fp8_flashmla"}) {
    const Outcome eager = generate(dtype, "", 0, true, prompts);
    const Outcome graphs = generate(dtype, "", std::nullopt, true, prompts);
    ASSERT_EQ(eager.tokens.size(), prompts.size());
    ASSERT_EQ(graphs.tokens.size(), prompts.size());
    int same = 0;
    for (size_t i = 0; i < prompts.size(); ++i) same += eager.tokens[i] == graphs.tokens[i];
    std::printf(
        "house-mla engine, kv %s, one request at a time: graphs on and off give the same "
        "tokens for %d/%zu prompts\n",
        dtype, same, prompts.size());
    EXPECT_EQ(same, int(prompts.size())) << dtype;
    EXPECT_EQ(graphs.mla_fallbacks, 0);
  }
}

}  // namespace
}  // namespace strata::testing
