// What the fused MLA query tests share (mla_query_parity_test.cc: a q_lora layer's;
// mla_query_proj_parity_test.cc: one without q_lora): a decode step's attention side — sequences
// grown by one token each, the KV layout of a row format, random positions, rope frequencies,
// MlaInputsArgs — and the check that the fused launch left the separate ops' bytes.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "parity/mla_sequences.h"
#include "parity/op_pair.h"

namespace strata::testing {

class MlaQueryStep {
 public:
  MlaQueryStep(parity::Pair& p, const MlaFormat& f, const MlaDims& d, int nope, int tokens,
               bool interleaved)
      : f_(f), seqs_(p.rng(), 16, std::vector<int>(size_t(tokens), 8)) {
    lay_ = mla_test_layout(f, d, 16, seqs_.num_pages());
    for (int i = 0; i < 3; ++i) meta_ = seqs_.grow(std::vector<int>(size_t(tokens), 1));
    for (int i = 0; i < tokens; ++i) positions_.push_back(int32_t(p.rng()() % 100000));
    meta_.positions = positions_.data();
    for (int i = 0; i < d.rope / 2; ++i)
      inv_freq_.push_back(std::pow(10000.0f, -2.0f * float(i) / float(d.rope)));
    args_ = MlaInputsArgs{.eps = 1e-6f,
                          .rope = RopeArgs{.inv_freq = inv_freq_.data(),
                                           .attention_factor = 1.1f,
                                           .rotary_dim = d.rope,
                                           .offset = 0,
                                           .interleaved = interleaved},
                          .q_rope_offset = nope};
  }
  MlaQueryStep(const MlaQueryStep&) = delete;  // meta_ and args_ point into this object
  MlaQueryStep& operator=(const MlaQueryStep&) = delete;

  const AttentionMetadata& meta() const { return meta_; }
  const MlaInputsArgs& args() const { return args_; }
  int64_t tokens() const { return meta_.num_tokens; }
  std::unique_ptr<KvStorage> alloc_kv(Backend& be) const {
    auto kv = be.alloc_kv(lay_);
    kv->set_scales(1, f_.scale, 1.0f);
    return kv;
  }

 private:
  const MlaFormat& f_;
  GrowingSequences seqs_;
  KvLayout lay_;
  AttentionMetadata meta_;
  std::vector<int32_t> positions_;
  std::vector<float> inv_freq_;
  MlaInputsArgs args_;
};

// The formats and variants a fused MLA query test runs for one case: bf16 rows (interleaved pairs;
// neox pairs, with f32 norm weights for the main case; for the main case also with L2 prefetch
// hints), and for the main case e4m3 and FlashMLA rows; 1 and 2 tokens each.
// check(format, tokens, interleaved, norm_f32, l2_hints).
template <typename Check>
void for_each_query_variant(bool main_case, Check&& check) {
  for (const MlaFormat& f : kMlaFormats) {
    const std::string name = f.name;
    if (name != "bf16" && !(main_case && (name == "fp8_flashmla" || name == "e4m3 scale 0.37")))
      continue;
    for (int tokens : {1, 2}) {
      check(f, tokens, true, false, false);
      if (name == "bf16") check(f, tokens, false, main_case, false);
      if (name == "bf16" && main_case) check(f, tokens, true, false, true);
    }
  }
}

// A query's outputs on the GPU: q (rope applied), q_latent, the cache rows left in kv_row, the KV.
struct MlaQueryOutputs {
  const Tensor &q, &q_latent, &kv_row;
  KvStorage& kv;
};
// The fused launch left every byte the separate ops left (layer 1 written, layer 0 untouched).
inline void expect_same_query_bytes(const MlaQueryOutputs& fused, const MlaQueryOutputs& separate) {
  EXPECT_EQ(parity::device_bytes(fused.q), parity::device_bytes(separate.q)) << "q";
  EXPECT_EQ(parity::device_bytes(fused.q_latent), parity::device_bytes(separate.q_latent))
      << "q_latent";
  EXPECT_EQ(parity::device_bytes(fused.kv_row), parity::device_bytes(separate.kv_row))
      << "kv_row (the cache rows)";
  for (int layer : {0, 1})
    EXPECT_EQ(parity::device_bytes(fused.kv.k(layer)), parity::device_bytes(separate.kv.k(layer)))
        << "KV layer " << layer;
}

}  // namespace strata::testing
