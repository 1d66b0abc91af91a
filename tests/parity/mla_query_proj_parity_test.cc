// The MLA query of a layer without q_lora in one launch (Backend::mla_query_proj; the CUDA
// backend's mla_query_proj.cu, CudaTunables::mla_query_proj_fusion) against the ops it replaces
// run one by one on the GPU (the q_proj and kv_a linears, per_head_linear with W_UK,
// mla_attention_inputs: what arch/deepseek.cc runs when it returns false) and against the CPU
// backend's ops.
//
// What must hold and the bounds:
//  - bit for bit the separate ops' results: q (rope applied), q_latent (latent and rope columns),
//    the cache rows left in kv_row and every byte of the KV storage, at Moonlight's dims (16
//    heads, hidden 2,048, 512 + 64, clusters of 8 CTAs, ~5 kv_a rows a CTA), the tiny
//    DeepSeek-V2-Lite-style fixture's (4 heads, hidden 64: one CTA a head, 10 kv_a rows a CTA)
//    and odd ones (5 heads, hidden 328: a row's last 256-value step partial, clusters of 4), 1
//    and 2 tokens, neox and interleaved pairs, bf16 and f32 norm weights, bf16, e4m3 and FlashMLA
//    rows;
//  - the launch twice in a row gives the same bits (its last CTA makes the cache rows and zeroes
//    the count for the next launch);
//  - against the CPU backend's ops on the same values (float32): NMSE of q and q_latent < 1e-4;
//  - the fused call is one launch (mla_query_proj) and the separate one is not;
//  - it returns false, having launched nothing, with the tunable off, at 3 tokens and with
//    k-split GEMVs (gemv_max_ksplit 2: the separate path's bits would differ);
//  - prefetch hints carried by the fused launch (weights into L2: l2_prefetch.h) change no bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "parity/fused_fixture.h"
#include "parity/mla_query_step.h"
#include "parity/op_pair.h"

namespace strata::testing {
namespace {

using parity::nmse;
using parity::Pair;
using parity::profiled;

struct Case {
  const char* name;
  int heads, hidden, latent, rope, nope;
};
const Case kCases[] = {{"moonlight", 16, 2048, 512, 64, 128},
                       {"tiny fixture", 4, 64, 32, 8, 16},
                       {"odd", 5, 328, 128, 32, 64}};

// The operands on one backend (the same values on every backend).
struct Operands {
  DeviceTensorPtr h, w_uk, kv_norm, kv_row, q, q_latent;
  LinearWeight q_proj, kv_a;
};

class QueryRun {
 public:
  QueryRun(Pair& p, const Case& c, const MlaFormat& f, int tokens, bool interleaved, bool norm_f32)
      : c_(c),
        norm_f32_(norm_f32),
        step_(p, f, MlaDims{c.latent, c.rope, c.heads}, c.nope, tokens, interleaved) {
    const int64_t t = tokens, qd = c.nope + c.rope;
    h_ = p.random(t * c.hidden, 1.0f);
    q_proj_ = p.random(int64_t(c.heads) * qd * c.hidden, 1.0f / std::sqrt(float(c.hidden)));
    // kv_a's rows at the format's scale (the cache rows' rope part is stored as kv_a makes it).
    kv_a_ = p.random(int64_t(c.latent + c.rope) * c.hidden, f.scale / std::sqrt(float(c.hidden)));
    w_uk_ = p.random(int64_t(c.heads) * c.latent * c.nope, 1.0f / std::sqrt(float(c.nope)));
    kv_norm_ = p.random(c.latent, 0.5f);
    for (float& w : kv_norm_) w = round_to_bf16(w + 1.0f);
  }

  Operands upload(Backend& be, DType act) {
    const int64_t t = step_.tokens(), qd = c_.nope + c_.rope, width = c_.latent + c_.rope;
    auto up = [&](std::vector<float>& v, const Shape& s, DType dt) {
      return be.upload(Tensor::make(v.data(), DType::kF32, s), dt);
    };
    const DType norm_dt = act == DType::kF32 || norm_f32_ ? DType::kF32 : act;
    Operands o;
    o.h = up(h_, {t, c_.hidden}, act);
    o.q_proj.weight = up(q_proj_, {int64_t(c_.heads) * qd, c_.hidden}, act);
    o.kv_a.weight = up(kv_a_, {width, c_.hidden}, act);
    o.w_uk = up(w_uk_, {c_.heads, c_.latent, c_.nope}, act);
    o.kv_norm = up(kv_norm_, {c_.latent}, norm_dt);
    o.kv_row = be.alloc(act, {t, width});
    o.q = be.alloc(act, {t, c_.heads, qd});
    o.q_latent = be.alloc(act, {t, c_.heads, width});
    return o;
  }
  std::unique_ptr<KvStorage> alloc_kv(Backend& be) { return step_.alloc_kv(be); }
  bool fused(Backend& be, const Operands& o, KvStorage& kv) {
    return be.mla_query_proj({.h = *o.h,
                              .q_proj = o.q_proj,
                              .kv_a = o.kv_a,
                              .w_uk = *o.w_uk,
                              .kv_norm = *o.kv_norm,
                              .args = step_.args(),
                              .kv_row = *o.kv_row,
                              .q = *o.q,
                              .q_latent = *o.q_latent},
                             kv, 1, step_.meta());
  }
  void separate(Backend& be, const Operands& o, KvStorage& kv) {
    be.linear(*o.h, o.q_proj, *o.q);
    be.linear(*o.h, o.kv_a, *o.kv_row);
    be.per_head_linear(*o.q, 0, *o.w_uk, *o.q_latent, 0);
    be.mla_attention_inputs(*o.kv_row, *o.kv_norm, *o.q, *o.q_latent, step_.args(), kv, 1,
                            step_.meta());
  }

 private:
  const Case& c_;
  bool norm_f32_;
  MlaQueryStep step_;
  std::vector<float> h_, q_proj_, kv_a_, w_uk_, kv_norm_;
};

// l2_hints: the fused launch also carries prefetch hints (Backend::prefetch: the q_proj and W_UK
// weights and a 24 MB buffer brought into L2 by its CTAs), which must change nothing.
void check_case(Pair& p, const Case& c, const MlaFormat& f, int tokens, bool interleaved,
                bool norm_f32, bool l2_hints = false) {
  SCOPED_TRACE(std::string(c.name) + " " + f.name + " tokens " + std::to_string(tokens) +
               (interleaved ? " interleaved" : " neox") + (norm_f32 ? " f32 norm" : "") +
               (l2_hints ? " L2 hints" : ""));
  QueryRun r(p, c, f, tokens, interleaved, norm_f32);
  cuda::CudaBackend& cuda = p.cuda();
  const Operands fu = r.upload(*p.gpu_, DType::kBF16), sep = r.upload(*p.gpu_, DType::kBF16);
  const Operands cpu = r.upload(*p.cpu_, DType::kF32);
  auto kv_fu = r.alloc_kv(*p.gpu_), kv_sep = r.alloc_kv(*p.gpu_), kv_cpu = r.alloc_kv(*p.cpu_);

  cuda.tune([l2_hints](cuda::CudaTunables& t) {
    t.mla_query_proj_fusion = true;
    t.l2_prefetch_bytes = l2_hints ? int64_t(64) << 20 : 0;
  });
  auto big = p.gpu_->alloc(DType::kBF16, {int64_t(12) << 20});
  bool took = false;
  std::string fused_ops;
  for (int round = 0; round < 2; ++round) {  // the second launch after the first's reset
    if (l2_hints) {
      cuda.prefetch(fu.q_proj.weight->view());
      cuda.prefetch(fu.w_uk->view());
      cuda.prefetch(big->view());
    }
    fused_ops = profiled(cuda, [&] { took = r.fused(cuda, fu, *kv_fu); });
    ASSERT_TRUE(took) << "mla_query_proj did not take these sizes (round " << round << ")";
  }
  cuda.tune([](cuda::CudaTunables& t) {
    t.mla_query_proj_fusion = false;
    t.l2_prefetch_bytes = 0;
  });
  const std::string sep_ops = profiled(cuda, [&] { r.separate(cuda, sep, *kv_sep); });
  EXPECT_FALSE(r.fused(*p.cpu_, cpu, *kv_cpu)) << "the Backend default has no fused query";
  r.separate(*p.cpu_, cpu, *kv_cpu);
  EXPECT_NE(fused_ops.find("mla_query_proj"), std::string::npos) << fused_ops;
  for (const char* op : {"gemv", "per_head", "mla_inputs"})
    EXPECT_EQ(fused_ops.find(op), std::string::npos) << op << " in " << fused_ops;
  EXPECT_EQ(sep_ops.find("mla_query_proj"), std::string::npos) << sep_ops;

  expect_same_query_bytes({*fu.q, *fu.q_latent, *fu.kv_row, *kv_fu},
                          {*sep.q, *sep.q_latent, *sep.kv_row, *kv_sep});

  const double e_q = nmse(p.get(*fu.q, true), p.get(*cpu.q, false));
  const double e_lat = nmse(p.get(*fu.q_latent, true), p.get(*cpu.q_latent, false));
  const double e_kv = nmse(p.get(*fu.kv_row, true), p.get(*cpu.kv_row, false));
  EXPECT_LT(e_q, 1e-4);
  EXPECT_LT(e_lat, 1e-4);
  EXPECT_LT(e_kv, 1e-4);
  std::printf(
      "mla query proj %-12s %-14s tokens %d %s%s: nmse vs CPU q %.2g q_latent %.2g "
      "kv_row %.2g\n",
      c.name, f.name, tokens, interleaved ? "interleaved" : "neox", norm_f32 ? " f32-norm" : "",
      e_q, e_lat, e_kv);
}

TEST(MlaQueryProj, FusedEqualsSeparateOps) {
  Pair p;
  for (const Case& c : kCases)
    for_each_query_variant(c.heads == 16, [&](const MlaFormat& f, int tokens, bool interleaved,
                                              bool norm_f32, bool l2_hints) {
      check_case(p, c, f, tokens, interleaved, norm_f32, l2_hints);
    });
}

TEST(MlaQueryProj, DeclinesWhatItDoesNotTake) {
  Pair p;
  cuda::CudaBackend& cuda = p.cuda();
  struct Decline {
    const char* why;
    int tokens;
    bool on;
    int ksplit;
  };
  for (const Decline& d : {Decline{"tunable off", 1, false, 1}, Decline{"3 tokens", 3, true, 1},
                           Decline{"k-split GEMVs", 1, true, 2}}) {
    SCOPED_TRACE(d.why);
    QueryRun r(p, kCases[0], kMlaFormats[0], d.tokens, true, false);
    const Operands o = r.upload(*p.gpu_, DType::kBF16);
    auto kv = r.alloc_kv(*p.gpu_);
    cuda.tune([&d](cuda::CudaTunables& t) {
      t.mla_query_proj_fusion = d.on;
      t.gemv_max_ksplit = d.ksplit;
    });
    bool took = true;
    const std::string ops = profiled(cuda, [&] { took = r.fused(cuda, o, *kv); });
    EXPECT_FALSE(took);
    EXPECT_EQ(ops.find("mla_query_proj"), std::string::npos) << ops;
  }
  cuda.tune([](cuda::CudaTunables& t) {
    t.mla_query_proj_fusion = false;
    t.gemv_max_ksplit = 1;
  });
}

}  // namespace
}  // namespace strata::testing
