// A q_lora layer's MLA query in one launch (Backend::mla_query; the CUDA backend's
// mla_query.cu, CudaTunables::mla_query_fusion) against the ops it replaces run one by one on
// the GPU (rms_norm, the q_b linear, per_head_linear with W_UK, mla_attention_inputs: what
// arch/deepseek.cc runs when mla_query returns false) and against the CPU backend's ops.
//
// What must hold and the bounds:
//  - bit for bit the separate ops' results: the q_a norm's rows, q (rope applied), q_latent
//    (latent and rope columns), the cache rows left in kv_row and every byte of the KV storage,
//    at a Kimi-K2.5 rank's dims (8 heads, q_lora_rank 1,536, 512 + 64, clusters of 8 CTAs), the
//    tiny fixture's (4 heads, q_lora_rank 48: the one-warp norm, one CTA a head) and house-mla's
//    (5 heads, 160, 128 + 32), 1 and 2 tokens, neox and interleaved pairs, bf16 and f32 norm
//    weights, bf16, e4m3 and FlashMLA rows;
//  - against the CPU backend's ops on the same values (float32): NMSE of q and q_latent < 1e-4
//    (a few bf16 roundings: ~1e-5);
//  - the fused call is one launch (mla_query) and the separate one is not (the per-op profile);
//  - mla_query returns false, having launched nothing, with the tunable off and at 3 tokens.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "parity/fused_fixture.h"
#include "parity/mla_sequences.h"
#include "parity/op_pair.h"

namespace strata::testing {
namespace {

using parity::device_bytes;
using parity::nmse;
using parity::Pair;
using parity::profiled;

struct Case {
  const char* name;
  int heads, q_lora, latent, rope, nope;
};
const Case kCases[] = {{"kimi-k2.5 rank", 8, 1536, 512, 64, 128},
                       {"tiny fixture", 4, 48, 32, 8, 16},
                       {"house-mla", 5, 160, 128, 32, 64}};

// The operands on one backend (the same values on every backend).
struct Operands {
  DeviceTensorPtr q_a, q_a_norm, w_uk, kv_row, kv_norm, q_a_normed, q, q_latent;
  LinearWeight q_b;
};

class QueryRun {
 public:
  QueryRun(Pair& p, const Case& c, const MlaFormat& f, int tokens, bool interleaved, bool norm_f32)
      : c_(c), f_(f), norm_f32_(norm_f32), seqs_(p.rng(), 16, std::vector<int>(size_t(tokens), 8)) {
    lay_ = mla_test_layout(f, MlaDims{c.latent, c.rope, c.heads}, 16, seqs_.num_pages());
    for (int i = 0; i < 3; ++i) meta_ = seqs_.grow(std::vector<int>(size_t(tokens), 1));
    for (int i = 0; i < tokens; ++i) positions_.push_back(int32_t(p.rng()() % 100000));
    meta_.positions = positions_.data();
    for (int i = 0; i < c.rope / 2; ++i)
      inv_freq_.push_back(std::pow(10000.0f, -2.0f * float(i) / float(c.rope)));
    args_ = MlaInputsArgs{.eps = 1e-6f,
                          .rope = RopeArgs{.inv_freq = inv_freq_.data(),
                                           .attention_factor = 1.1f,
                                           .rotary_dim = c.rope,
                                           .offset = 0,
                                           .interleaved = interleaved},
                          .q_rope_offset = c.nope};
    const int64_t t = tokens, qd = c.nope + c.rope;
    q_a_ = p.random(t * c.q_lora, 3.0f);
    q_a_norm_ = p.random(c.q_lora, 0.5f);
    for (float& w : q_a_norm_) w = round_to_bf16(w + 1.0f);
    q_b_ = p.random(int64_t(c.heads) * qd * c.q_lora, 1.0f / std::sqrt(float(c.q_lora)));
    w_uk_ = p.random(int64_t(c.heads) * c.latent * c.nope, 1.0f / std::sqrt(float(c.nope)));
    kv_row_ = p.random(t * (c.latent + c.rope), f.scale);
    kv_norm_ = p.random(c.latent, 0.5f);
    for (float& w : kv_norm_) w = round_to_bf16(w + 1.0f);
  }

  Operands upload(Backend& be, DType act) {
    const int64_t t = meta_.num_tokens, qd = c_.nope + c_.rope, width = c_.latent + c_.rope;
    auto up = [&](std::vector<float>& v, const Shape& s, DType dt) {
      return be.upload(Tensor::make(v.data(), DType::kF32, s), dt);
    };
    const DType norm_dt = act == DType::kF32 || norm_f32_ ? DType::kF32 : act;
    Operands o;
    o.q_a = up(q_a_, {t, c_.q_lora}, act);
    o.q_a_norm = up(q_a_norm_, {c_.q_lora}, norm_dt);
    o.q_b.weight = up(q_b_, {int64_t(c_.heads) * qd, c_.q_lora}, act);
    o.w_uk = up(w_uk_, {c_.heads, c_.latent, c_.nope}, act);
    o.kv_row = up(kv_row_, {t, width}, act);
    o.kv_norm = up(kv_norm_, {c_.latent}, norm_dt);
    o.q_a_normed = be.alloc(act, {t, c_.q_lora});
    o.q = be.alloc(act, {t, c_.heads, qd});
    o.q_latent = be.alloc(act, {t, c_.heads, width});
    return o;
  }
  std::unique_ptr<KvStorage> alloc_kv(Backend& be) {
    auto kv = be.alloc_kv(lay_);
    kv->set_scales(1, f_.scale, 1.0f);
    return kv;
  }
  bool fused(Backend& be, const Operands& o, KvStorage& kv) {
    return be.mla_query({.q_a = *o.q_a,
                         .q_a_norm = *o.q_a_norm,
                         .q_a_eps = 1e-6f,
                         .q_b = o.q_b,
                         .w_uk = *o.w_uk,
                         .kv_row = *o.kv_row,
                         .kv_norm = *o.kv_norm,
                         .args = args_,
                         .q_a_normed = *o.q_a_normed,
                         .q = *o.q,
                         .q_latent = *o.q_latent},
                        kv, 1, meta_);
  }
  void separate(Backend& be, const Operands& o, KvStorage& kv) {
    be.rms_norm(*o.q_a, *o.q_a_norm, 1e-6f, *o.q_a_normed);
    be.linear(*o.q_a_normed, o.q_b, *o.q);
    be.per_head_linear(*o.q, 0, *o.w_uk, *o.q_latent, 0);
    be.mla_attention_inputs(*o.kv_row, *o.kv_norm, *o.q, *o.q_latent, args_, kv, 1, meta_);
  }

 private:
  const Case& c_;
  const MlaFormat& f_;
  bool norm_f32_;
  GrowingSequences seqs_;
  KvLayout lay_;
  AttentionMetadata meta_;
  std::vector<int32_t> positions_;
  std::vector<float> inv_freq_, q_a_, q_a_norm_, q_b_, w_uk_, kv_row_, kv_norm_;
  MlaInputsArgs args_;
};

void check_case(Pair& p, const Case& c, const MlaFormat& f, int tokens, bool interleaved,
                bool norm_f32) {
  SCOPED_TRACE(std::string(c.name) + " " + f.name + " tokens " + std::to_string(tokens) +
               (interleaved ? " interleaved" : " neox") + (norm_f32 ? " f32 norm" : ""));
  QueryRun r(p, c, f, tokens, interleaved, norm_f32);
  cuda::CudaBackend& cuda = p.cuda();
  const Operands fu = r.upload(*p.gpu_, DType::kBF16), sep = r.upload(*p.gpu_, DType::kBF16);
  const Operands cpu = r.upload(*p.cpu_, DType::kF32);
  auto kv_fu = r.alloc_kv(*p.gpu_), kv_sep = r.alloc_kv(*p.gpu_), kv_cpu = r.alloc_kv(*p.cpu_);

  cuda.tune([](cuda::CudaTunables& t) { t.mla_query_fusion = true; });
  bool took = false;
  const std::string fused_ops = profiled(cuda, [&] { took = r.fused(cuda, fu, *kv_fu); });
  ASSERT_TRUE(took) << "mla_query did not take these sizes";
  cuda.tune([](cuda::CudaTunables& t) { t.mla_query_fusion = false; });
  const std::string sep_ops = profiled(cuda, [&] { r.separate(cuda, sep, *kv_sep); });
  EXPECT_FALSE(p.cpu_->mla_query({.q_a = *cpu.q_a,
                                  .q_a_norm = *cpu.q_a_norm,
                                  .q_a_eps = 1e-6f,
                                  .q_b = cpu.q_b,
                                  .w_uk = *cpu.w_uk,
                                  .kv_row = *cpu.kv_row,
                                  .kv_norm = *cpu.kv_norm,
                                  .args = MlaInputsArgs{},
                                  .q_a_normed = *cpu.q_a_normed,
                                  .q = *cpu.q,
                                  .q_latent = *cpu.q_latent},
                                 *kv_cpu, 1, AttentionMetadata{}))
      << "the Backend default has no fused query";
  r.separate(*p.cpu_, cpu, *kv_cpu);
  EXPECT_NE(fused_ops.find("mla_query"), std::string::npos) << fused_ops;
  EXPECT_EQ(fused_ops.find("gemv"), std::string::npos) << fused_ops;
  EXPECT_EQ(fused_ops.find("per_head"), std::string::npos) << fused_ops;
  EXPECT_EQ(sep_ops.find("mla_query"), std::string::npos) << sep_ops;

  EXPECT_EQ(device_bytes(*fu.q_a_normed), device_bytes(*sep.q_a_normed)) << "q_a norm";
  EXPECT_EQ(device_bytes(*fu.q), device_bytes(*sep.q)) << "q";
  EXPECT_EQ(device_bytes(*fu.q_latent), device_bytes(*sep.q_latent)) << "q_latent";
  EXPECT_EQ(device_bytes(*fu.kv_row), device_bytes(*sep.kv_row)) << "kv_row";
  for (int layer : {0, 1})
    EXPECT_EQ(device_bytes(kv_fu->k(layer)), device_bytes(kv_sep->k(layer)))
        << "KV layer " << layer;

  const double e_q = nmse(p.get(*fu.q, true), p.get(*cpu.q, false));
  const double e_lat = nmse(p.get(*fu.q_latent, true), p.get(*cpu.q_latent, false));
  EXPECT_LT(e_q, 1e-4);
  EXPECT_LT(e_lat, 1e-4);
  std::printf("mla query %-16s %-14s tokens %d %s%s: nmse vs CPU q %.2g q_latent %.2g\n", c.name,
              f.name, tokens, interleaved ? "interleaved" : "neox", norm_f32 ? " f32-norm" : "",
              e_q, e_lat);
}

TEST(MlaQuery, FusedEqualsSeparateOps) {
  Pair p;
  for (const Case& c : kCases) {
    for (const MlaFormat& f : kMlaFormats) {
      const std::string name = f.name;
      const bool kimi = c.heads == 8;
      if (name != "bf16" && !(kimi && (name == "fp8_flashmla" || name == "e4m3 scale 0.37")))
        continue;
      for (int tokens : {1, 2}) {
        check_case(p, c, f, tokens, true, false);
        if (name == "bf16") check_case(p, c, f, tokens, false, kimi);
      }
    }
  }
}

TEST(MlaQuery, DeclinesWhatItDoesNotTake) {
  Pair p;
  cuda::CudaBackend& cuda = p.cuda();
  for (int tokens : {1, 3}) {
    QueryRun r(p, kCases[0], kMlaFormats[0], tokens, true, false);
    const Operands o = r.upload(*p.gpu_, DType::kBF16);
    auto kv = r.alloc_kv(*p.gpu_);
    for (bool on : {false, true}) {
      if (on && tokens == 1) continue;  // taken: FusedEqualsSeparateOps
      cuda.tune([on](cuda::CudaTunables& t) { t.mla_query_fusion = on; });
      bool took = true;
      const std::string ops = profiled(cuda, [&] { took = r.fused(cuda, o, *kv); });
      EXPECT_FALSE(took) << "tokens " << tokens << " tunable " << on;
      EXPECT_EQ(ops.find("mla_query"), std::string::npos) << ops;
    }
  }
  cuda.tune([](cuda::CudaTunables& t) { t.mla_query_fusion = false; });
}

}  // namespace
}  // namespace strata::testing
