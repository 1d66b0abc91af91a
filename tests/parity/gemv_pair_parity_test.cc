// Two decode GEMVs on one input as one launch (backend/cuda/linear.h GemvParams::w2; MLA's q_a
// or q_proj, then kv_a, which arch/deepseek.cc records back to back). Graph mode merges them
// when CudaTunables::gemv_pair_fusion is on; each block computes what it would in a launch of
// its own, so the bound is equality with the eager run's two launches, bit for bit, and the
// step records one launch fewer (GraphStats::launches). Shapes: one Kimi-K2.5 rank's q_a and
// kv_a (7168 -> 1536, 576), Moonlight's q_proj and kv_a (2048 -> 3072, 576), odd rows with
// biases, m = 1 and 2, at the default one warp a row and at up to 4 (gemv_max_ksplit). Not
// merged, and still the eager bits: rows whose k splits differ (up to 4 warps a row: a 16-row
// GEMV after a 16,384-row one), a second GEMV on another input, the tunable off.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/linear.h"
#include "parity/op_pair.h"

namespace strata::parity {
namespace {

struct PairCase {
  const char* name;
  int64_t k, n1, n2;
  bool bias, same_x, merges;  // merges: when the tunable is on
  int max_ksplit;             // CudaTunables::gemv_max_ksplit for the case (0: the default)
};

LinearWeight gpu_weight(Pair& p, int64_t n, int64_t k, bool bias) {
  LinearWeight w;
  auto v = p.random(n * k, 0.03f);
  w.weight = p.gpu_->upload(Tensor::make(v.data(), DType::kF32, {n, k}), DType::kBF16);
  if (bias) {
    auto b = p.random(n, 0.1f);
    w.bias = p.gpu_->upload(Tensor::make(b.data(), DType::kF32, {n}), DType::kF32);
  }
  return w;
}

TEST(GemvPair, GraphModeMergesTwoGemvsOnOneInput) {
  Pair p;
  auto& gpu = p.cuda();
  const cuda::CudaTunables defaults = gpu.tunables();
  ASSERT_TRUE(defaults.fusion);
  const PairCase cases[] = {
      {"kimi q_a + kv_a", 7168, 1536, 576, false, true, true, 0},
      {"moonlight q_proj + kv_a", 2048, 3072, 576, false, true, true, 0},
      {"odd rows, biases", 1024, 333, 77, true, true, true, 0},
      {"kimi, up to 4 warps a row", 7168, 1536, 576, false, true, true, 4},
      {"k splits differ", 512, 16384, 16, false, true, false, 4},
      {"another input", 2048, 1536, 576, false, false, false, 0},
  };
  for (const PairCase& c : cases) {
    gpu.tune([&](cuda::CudaTunables& t) {
      t.gemv_max_ksplit = c.max_ksplit > 0 ? c.max_ksplit : defaults.gemv_max_ksplit;
    });
    const cuda::CudaTunables with_ksplit = gpu.tunables();
    const LinearWeight w1 = gpu_weight(p, c.n1, c.k, c.bias), w2 = gpu_weight(p, c.n2, c.k, c.bias);
    for (int64_t m : {1, 2}) {
      ASSERT_LE(m, defaults.gemv_max_rows);
      auto x = gpu.alloc(DType::kBF16, {m, c.k}), x2 = gpu.alloc(DType::kBF16, {m, c.k});
      auto step = [&] {  // as arch/deepseek.cc's attention_block: two linears on h
        auto o1 = gpu.alloc(DType::kBF16, {m, c.n1}), o2 = gpu.alloc(DType::kBF16, {m, c.n2});
        gpu.linear(*x, w1, *o1);
        gpu.linear(c.same_x ? *x : *x2, w2, *o2);
        std::vector<float> out(size_t(m * (c.n1 + c.n2)));
        gpu.download_f32(*o1, out.data());  // ends the step (graph mode: capture or replay)
        gpu.download_f32(*o2, out.data() + m * c.n1);
        return out;
      };
      auto fill = [&](uint64_t seed) {
        gpu.fill_random(*x, seed, 1.0f);
        gpu.fill_random(*x2, seed + 10, 1.0f);
      };
      expect_merge_keeps_eager_bits(
          gpu, fill, step, [](cuda::CudaTunables& t, bool on) { t.gemv_pair_fusion = on; },
          [&](bool on) { return on && c.merges ? 1 : 2; },
          std::string(c.name) + " m " + std::to_string(m));
      gpu.set_tunables(with_ksplit);
    }
    gpu.set_tunables(defaults);
    std::printf("gemv pair %-24s k %lld rows %lld + %lld, m 1 and 2: eager bits, %s\n", c.name,
                (long long)c.k, (long long)c.n1, (long long)c.n2,
                c.merges ? "one launch merged" : "two launches");
  }
}

}  // namespace
}  // namespace strata::parity
