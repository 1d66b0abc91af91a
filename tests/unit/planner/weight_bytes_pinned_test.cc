// The planner's weight figure for every config in ../shared/configs, pinned: each expected value
// is written out from the config's numbers (hidden H, vocab V, layers L, ...) with the per-format
// byte rules, independently of model/inventory.cc, and then as the number it comes to. The
// policy is the CUDA backend's (bf16; fp8 blocks and INT4 kept packed: what `strata plan` says).
#include <gtest/gtest.h>

#include "model/config.h"
#include "model/inventory.h"

namespace strata {
namespace {

const std::string kConfigs = std::string(STRATA_SHARED_DIR) + "/configs/";

int64_t planned(const std::string& config, int tp) {
  auto spec = load_model_spec(kConfigs + config);
  EXPECT_TRUE(spec.ok()) << spec.status().to_string();
  return summarize_inventory(*spec, build_inventory(*spec), tp, quant_layout(*spec),
                             kGpuWeightPolicy)
      .bytes_per_rank;
}

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
// One [n, k] linear on the device, per format.
int64_t bf16(int64_t n, int64_t k) { return n * k * 2; }
// INT4 group g: half a byte a value, a bf16 scale per g values of a row.
int64_t int4(int64_t n, int64_t k, int64_t g) { return n * k / 2 + n * (k / g) * 2; }
// fp8 128x128: a byte a value, a float32 scale per block, scale rows padded to 4 floats.
int64_t fp8(int64_t n, int64_t k) { return n * k + cdiv(n, 128) * cdiv(cdiv(k, 128), 4) * 4 * 4; }
using Linear = int64_t (*)(int64_t, int64_t);

// Llama / Qwen2: embedding and lm_head (bf16), per layer two norms, q/k/v/o, gate/up/down (and
// q/k/v biases in float32), a final norm.
int64_t llama(int64_t V, int64_t H, int64_t I, int64_t L, int64_t q, int64_t kv, Linear lin,
              bool qkv_bias) {
  const int64_t layer = 2 * H * 2 + lin(q, H) + 2 * lin(kv, H) + lin(H, q) + 2 * lin(I, H) +
                        lin(H, I) + (qkv_bias ? (q + 2 * kv) * 4 : 0);
  return 2 * V * H * 2 + L * layer + H * 2;
}

// DeepSeek-V3 architecture (kv_lora 512, rope 64, nope 128, v 128) on one rank of `tp`: MLA
// attention (q_a/kv_a replicated, q_b or q_proj and o_proj split by heads, kv_b_proj always
// dense bf16), `dense` dense-MLP layers, the rest MoE (router bf16, e_score bias float32 when
// noaux_tc, routed experts in `expert`, shared experts in `lin`), vocab split with the
// embedding's zero row under tp.
struct Ds {
  int64_t V, H, L, heads, q_lora, I, E, shared, MI, dense;
  bool bias;
  Linear lin, expert;
};
int64_t deepseek(const Ds& d, int tp) {
  const int64_t kv = 512, rope = 64, nope = 128, v = 128, h = d.heads / tp;
  int64_t attn =
      2 * d.H * 2 + d.lin(kv + rope, d.H) + kv * 2 + bf16(h * (nope + v), kv) + d.lin(d.H, h * v);
  attn += d.q_lora > 0 ? d.lin(d.q_lora, d.H) + d.q_lora * 2 + d.lin(h * (nope + rope), d.q_lora)
                       : d.lin(h * (nope + rope), d.H);
  const int64_t i = d.I / tp, mi = d.MI / tp, si = d.shared * d.MI / tp;
  const int64_t mlp = 2 * d.lin(i, d.H) + d.lin(d.H, i);
  const int64_t moe = d.E * d.H * 2 + (d.bias ? d.E * 4 : 0) +
                      d.E * (2 * d.expert(mi, d.H) + d.expert(d.H, mi)) + 2 * d.lin(si, d.H) +
                      d.lin(d.H, si);
  const int64_t embed = 2 * cdiv(d.V, tp) * d.H * 2 + (tp > 1 ? d.H * 2 : 0);
  return embed + d.L * attn + d.dense * mlp + (d.L - d.dense) * moe + d.H * 2;
}

int64_t int4_g32(int64_t n, int64_t k) { return int4(n, k, 32); }
int64_t int4_g128(int64_t n, int64_t k) { return int4(n, k, 128); }

TEST(PinnedWeightBytes, DenseModels) {
  // Llama-3.1-8B: V 128,256, H 4,096, I 14,336, 32 layers, q 32 × 128, kv 8 × 128.
  EXPECT_EQ(llama(128256, 4096, 14336, 32, 4096, 1024, bf16, false), 16060522496);
  EXPECT_EQ(planned("llama-3.1-8b", 1), 16060522496);
  // Qwen2.5-7B: V 152,064, H 3,584, I 18,944, 28 layers, q 28 × 128, kv 4 × 128, q/k/v biases.
  EXPECT_EQ(llama(152064, 3584, 18944, 28, 3584, 512, bf16, true), 15231491072);
  EXPECT_EQ(planned("qwen2.5-7b", 1), 15231491072);
}

TEST(PinnedWeightBytes, W4A16Llama) {
  // Every decoder linear INT4 group 128, embedding and lm_head bf16: 5.31 GiB (bf16: 14.96).
  EXPECT_EQ(llama(128256, 4096, 14336, 32, 4096, 1024, int4_g128, false), 5700591616);
  EXPECT_EQ(planned("llama-3.1-8b-w4a16", 1), 5700591616);
}

TEST(PinnedWeightBytes, SmallMlaMoeModels) {
  // Moonlight-16B-A3B: V 163,840, H 2,048, 27 layers (1 dense, I 11,264), 16 heads, no q_lora,
  // 64 experts of 1,408 + 2 shared, noaux_tc bias; all bf16.
  const Ds moonlight{163840, 2048, 27, 16, 0, 11264, 64, 2, 1408, 1, true, bf16, bf16};
  EXPECT_EQ(deepseek(moonlight, 1), 31920223744);
  EXPECT_EQ(planned("moonlight-16b-a3b", 1), 31920223744);
  // DeepSeek-V2-Lite: the same shape with V 102,400, I 10,944 and a greedy router (no bias).
  const Ds v2lite{102400, 2048, 27, 16, 0, 10944, 64, 2, 1408, 1, false, bf16, bf16};
  EXPECT_EQ(deepseek(v2lite, 1), 31412968448);
  EXPECT_EQ(planned("deepseek-v2-lite", 1), 31412968448);
}

TEST(PinnedWeightBytes, DeepseekV3Fp8) {
  // V 129,280, H 7,168, 61 layers (3 dense, I 18,432), 128 heads, q_lora 1,536, 256 experts of
  // 2,048 + 1 shared; every decoder linear fp8 128x128 but kv_b_proj (dense bf16 on the device).
  const Ds v3{129280, 7168, 61, 128, 1536, 18432, 256, 1, 2048, 3, true, fp8, fp8};
  EXPECT_EQ(deepseek(v3, 1), 674173772128);
  EXPECT_EQ(planned("deepseek-v3", 1), 674173772128);
  // One rank of tp 8: 16 heads, dense I 2,304 (scale rows of down_proj: 18 -> 20 floats), expert
  // slices of 256 (2 -> 4 floats).
  EXPECT_EQ(deepseek(v3, 8), 85274719456);
  EXPECT_EQ(planned("deepseek-v3", 8), 85274719456);
}

TEST(PinnedWeightBytes, KimiK25) {
  // V 163,840, H 7,168, 61 layers (1 dense), 64 heads, q_lora 1,536, 384 INT4 (group 32)
  // experts of 2,048 + 1 bf16 shared expert; attention and dense MLP bf16.
  const Ds kimi{163840, 7168, 61, 64, 1536, 18432, 384, 1, 2048, 1, true, bf16, int4_g32};
  EXPECT_EQ(deepseek(kimi, 1), 594205351936);
  EXPECT_EQ(planned("kimi-k2.5", 1), 594205351936);
  EXPECT_EQ(deepseek(kimi, 8), 76182607872);  // 70.95 GiB: one H200 holds one rank
  EXPECT_EQ(planned("kimi-k2.5", 8), 76182607872);
}

}  // namespace
}  // namespace strata
