// FP8 KV cache on the CUDA backend against the CPU reference (issue 8).
//
// What must hold and the bounds:
//  - the device's float -> fp8 conversion is the CPU's bit for bit (host build of the same
//    function over every non-NaN bf16 value and a sweep of float32 values);
//  - kv_write stores the same bytes as the CPU backend for the same bf16 K/V, for e4m3 and e5m2,
//    unit and non-unit per-layer scales, mixed bf16/fp8 layers (every one of the 65,536 bf16 bit
//    patterns but the NaNs goes through it);
//  - paged attention (decode split-KV and chunked prefill) over identical fp8 caches: NMSE
//    against the CPU < 1e-4, the bound of the bf16 attention tests (the cache holds the same
//    values on both sides; what differs is the order of float32 sums and bf16 outputs);
//  - house-llama with an fp8 KV cache, CUDA vs the CPU backend with the same fp8 KV dtype and
//    scales, teacher-forced over the fixture sequences (prefill) and token by token (decode):
//    logits NMSE < 2e-3 and argmax agreement >= 80% with every disagreement a near-tie (< 5% of
//    the row's largest |logit|). The two backends' K/V differ before rounding (bf16 vs float32
//    activations), so some values land on the other side of an fp8 rounding boundary: the bound
//    is looser than bf16's 5e-4 / 90% and of the order of the fp8 quantization error itself
//    (the CPU's fp8 logits against the bf16-KV logits are printed alongside: e4m3 1.7e-4-7e-4,
//    e5m2 4e-4-2.6e-3; measured against the CPU's fp8: e4m3 7e-5-5.8e-4, e5m2 2e-4-1.4e-3, and
//    e5m2's 2 mantissa bits flip 3 of 19 near-tie argmaxes, gaps <= 0.4%, on one 19-token
//    sequence);
//  - layouts the CUDA backend does not implement are refused with a Status naming the reason, and
//    the MLA row formats (issue 22) accepted.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/fp8.cuh"
#include "parity/kv_fp8_attention.h"
#include "support/golden.h"

namespace strata::testing {
namespace {

using parity::Backends;
using parity::run_fp8_attention;
using parity::two_layer_layout;

std::vector<float> all_bf16_values_but_nan() {
  std::vector<float> v;
  for (uint32_t b = 0; b < 65536; ++b) {
    const float f = bf16_to_f32(uint16_t(b));
    v.push_back(std::isnan(f) ? 0.0f : f);
  }
  return v;
}

TEST(KvFp8, DeviceEncoderMatchesCpuConversion) {
  int64_t n = 0, bad = 0;
  auto check = [&](float f) {
    ++n;
    bad += cuda::float_to_e4m3(f) != f32_to_fp8_e4m3(f);
    bad += cuda::float_to_e5m2(f) != f32_to_fp8_e5m2(f);
  };
  for (float f : all_bf16_values_but_nan())
    for (float s : {1.0f, 1.0f / 0.37f, 1.0f / 3.0f}) check(f * s);
  for (uint64_t u = 0; u < (uint64_t(1) << 32); u += 4099) {
    float f;
    const uint32_t b = uint32_t(u);
    std::memcpy(&f, &b, 4);
    if (!std::isnan(f)) check(f);
  }
  EXPECT_EQ(bad, 0) << "of " << n;
  EXPECT_EQ(cuda::float_to_e4m3(NAN), f32_to_fp8_e4m3(NAN));
  EXPECT_EQ(cuda::float_to_e5m2(INFINITY), f32_to_fp8_e5m2(INFINITY));
}

TEST(KvFp8, KvWriteStoresTheCpuBytes) {
  Backends b;
  const int k_dim = 64, page = 16;
  auto vals = all_bf16_values_but_nan();
  const int tokens = int(vals.size()) / k_dim;  // 1024
  std::vector<float> vv(vals.rbegin(), vals.rend());
  std::vector<int32_t> slots(static_cast<size_t>(tokens));
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), std::mt19937(7));
  std::vector<int32_t> zeros(size_t(tokens), 0);
  const int32_t none[1] = {0};  // a write-only step: no sequences, empty CSR arrays
  AttentionMetadata meta{.num_seqs = 0,
                         .num_tokens = tokens,
                         .page_size = page,
                         .q_indptr = none,
                         .kv_lens = none,
                         .page_indptr = none,
                         .page_indices = none,
                         .positions = zeros.data(),
                         .slot_mapping = slots.data()};
  for (DType dt : {DType::kFP8E4M3, DType::kFP8E5M2}) {
    for (auto [ks, vs] : {std::pair{1.0f, 1.0f}, {0.37f, 2.5f}}) {
      KvLayout lay = two_layer_layout(k_dim, tokens / page, page, dt);
      auto kc = b.cpu->alloc_kv(lay), kg = b.gpu->alloc_kv(lay);
      for (int l = 0; l < 2; ++l) {
        kc->set_scales(l, l ? ks : 1.0f, l ? vs : 1.0f);
        kg->set_scales(l, l ? ks : 1.0f, l ? vs : 1.0f);
      }
      auto k_cpu = b.up(*b.cpu, vals, {tokens, k_dim}, DType::kF32);
      auto v_cpu = b.up(*b.cpu, vv, {tokens, k_dim}, DType::kF32);
      auto k_gpu = b.up(*b.gpu, vals, {tokens, k_dim}, DType::kBF16);
      auto v_gpu = b.up(*b.gpu, vv, {tokens, k_dim}, DType::kBF16);
      for (int l = 0; l < 2; ++l) {
        b.cpu->kv_write(*kc, l, *k_cpu, *v_cpu, meta);
        b.gpu->kv_write(*kg, l, *k_gpu, *v_gpu, meta);
        for (bool is_k : {true, false}) {
          const auto c = b.raw(is_k ? kc->k(l) : kc->v(l), false);
          const auto g = b.raw(is_k ? kg->k(l) : kg->v(l), true);
          ASSERT_EQ(c.size(), g.size());
          int64_t diff = 0;  // bf16 layer 0 too: both round the same values to bf16
          for (size_t i = 0; i < c.size(); ++i) diff += c[i] != g[i];
          EXPECT_EQ(diff, 0) << dtype_name(dt) << " layer " << l << (is_k ? " K" : " V")
                             << " scales " << ks << "/" << vs;
        }
      }
      std::printf("kv_write %s scales %.2f/%.2f: %d tokens x %d, bytes equal the CPU's\n",
                  dtype_name(dt), ks, vs, tokens, k_dim);
    }
  }
}

TEST(KvFp8, DecodeAttention) {
  for (DType dt : {DType::kFP8E4M3, DType::kFP8E5M2}) {
    run_fp8_attention(dt, 32, 8, 128, 16, {{0, 1}, {16, 1}, {299, 1}, {1000, 1}, {4098, 1}}, 1.0f,
                      1.0f);
    run_fp8_attention(dt, 5, 1, 64, 3, {{7, 1}, {500, 1}}, 0.37f, 2.5f);
    run_fp8_attention(dt, 4, 4, 16, 4, {{33, 1}, {2, 1}, {129, 1}}, 1.0f, 1.0f);
    run_fp8_attention(dt, 8, 2, 32, 1, {{60, 1}}, 3.0f, 0.5f);
  }
}

// Split-KV prefill mode (CudaTunables::prefill_split_mode) as a backend setup.
std::function<void(cuda::CudaBackend&)> split_mode(int mode) {
  return [mode](cuda::CudaBackend& be) {
    be.tune([&](cuda::CudaTunables& t) { t.prefill_split_mode = mode; });
  };
}

// The regular prefill kernels (split-KV: the test below); the variants the product does not run:
// bench/cuda/dev/dev_parity_test.cc.
TEST(KvFp8, PrefillAttention) {
  for (DType dt : {DType::kFP8E4M3, DType::kFP8E5M2})
    for (const parity::Fp8AttnCase& c : parity::fp8_prefill_cases())
      run_fp8_attention(dt, c.heads, c.kv_heads, c.hd, c.page, c.seqs, c.ks, c.vs, split_mode(0));
}

TEST(KvFp8, PrefillAttentionSplitKv) {
  // The split-KV prefill kernel over fp8 caches (f16 mma, fragments widened as read), forced on:
  // short chunks over long contexts mixed with fresh prompts and decodes, groups 1, 4, 8.
  const auto forced = split_mode(2);
  for (DType dt : {DType::kFP8E4M3, DType::kFP8E5M2}) {
    run_fp8_attention(dt, 32, 8, 128, 16, {{3000, 16}, {0, 77}, {4000, 1}, {200, 130}}, 1.0f, 1.0f,
                      forced);
    run_fp8_attention(dt, 5, 1, 64, 3, {{2000, 9}, {31, 5}}, 0.37f, 2.5f, forced);
    run_fp8_attention(dt, 8, 8, 128, 16, {{2500, 33}, {0, 65}}, 0.37f, 2.5f, forced);
    run_fp8_attention(dt, 16, 2, 128, 16, {{1030, 64}}, 3.0f, 0.5f, forced);
  }
}

TEST(KvFp8, RefusesLayoutsItDoesNotImplement) {
  auto gpu = make_cuda_backend();
  KvLayout base{.num_layers = 2,
                .num_pages = 4,
                .page_size = 16,
                .k_dim = 64,
                .v_dim = 64,
                .dtype = DType::kFP8E4M3};
  EXPECT_TRUE(gpu->check_kv_layout(base).ok());
  KvLayout f32 = base;
  f32.dtype = DType::kF32;
  EXPECT_FALSE(gpu->check_kv_layout(f32).ok());
  KvLayout mla = base;  // MLA: latent + rope in one K row, no V (issue 22: every CPU format)
  mla.k_dim = 160;
  mla.v_dim = 0;
  mla.rope_dim = 32;
  EXPECT_TRUE(gpu->check_kv_layout(mla).ok());  // fp8 plain rows
  mla.rope_dtype = DType::kBF16;
  EXPECT_TRUE(gpu->check_kv_layout(mla).ok());  // fp8 latent, bf16 rope part
  mla.rope_dtype = DType::kF32;
  EXPECT_TRUE(gpu->check_kv_layout(mla).ok());
  mla.rope_dtype = DType::kF16;
  const Status f16_rope = gpu->check_kv_layout(mla);
  EXPECT_FALSE(f16_rope.ok());
  EXPECT_NE(f16_rope.message().find("rope"), std::string::npos) << f16_rope.message();
  mla.rope_dtype = DType::kBF16;
  mla.k_dim = 161;  // 129 fp8 latent values: the bf16 rope part at an odd byte
  const Status odd = gpu->check_kv_layout(mla);
  EXPECT_FALSE(odd.ok());
  EXPECT_NE(odd.message().find("unaligned"), std::string::npos) << odd.message();
  mla.k_dim = 160;
  mla.rope_dtype.reset();
  mla.format = KvFormat::kFlashMlaFp8;
  EXPECT_TRUE(gpu->check_kv_layout(mla).ok());
  mla.dtype = DType::kBF16;
  EXPECT_TRUE(gpu->check_kv_layout(mla).ok());
  std::printf("refused: %s | %s\n", f16_rope.message().c_str(), odd.message().c_str());
}

// Fraction of rows with equal argmax; worst near-tie gap of the disagreements (see header).
double agreement(const std::vector<float>& a, const std::vector<float>& b, int64_t vocab,
                 double* gap) {
  const int64_t rows = int64_t(b.size()) / vocab;
  int64_t same = 0;
  *gap = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* ra = a.data() + r * vocab;
    const float* rb = b.data() + r * vocab;
    const int64_t ai = std::max_element(ra, ra + vocab) - ra,
                  bi = std::max_element(rb, rb + vocab) - rb;
    same += ai == bi;
    if (ai != bi) {
      float scale = 0;
      for (int64_t i = 0; i < vocab; ++i) scale = std::max(scale, std::fabs(rb[i]));
      *gap = std::max(*gap, double(rb[bi] - rb[ai]) / scale);
    }
  }
  return double(same) / double(rows);
}

// Logits of every position of `ids`: one prefill (chunk = all) or token by token (decode path).
std::vector<float> run_model(Model& m, const std::vector<int32_t>& ids, DType kv, float ks,
                             float vs, bool decode) {
  SingleSequence run(m, 16, int(ids.size()), kv);
  for (int l = 0; l < m.spec().num_layers; ++l) run.kv().set_scales(l, ks, vs);
  if (!decode) return run.step(ids, true);
  std::vector<float> all;
  for (int32_t id : ids) {
    auto row = run.step({id}, false);
    all.insert(all.end(), row.begin(), row.end());
  }
  return all;
}

TEST(KvFp8, HouseLlamaMatchesCpuBackend) {
  const std::string dir = shared_dir() + "/models/house-llama";
  auto cpu = make_cpu_backend();
  auto gpu = make_cuda_backend();
  auto cm = load_model(dir, *cpu);
  auto gm = load_model(dir, *gpu);
  ASSERT_TRUE(cm.ok() && gm.ok());
  Reference ref(shared_dir() + "/fixtures/house-llama/reference.safetensors");
  const int64_t vocab = (*gm)->spec().vocab_size;
  struct Case {
    DType dt;
    float ks, vs;
  };
  for (Case c : {Case{DType::kFP8E4M3, 1.0f, 1.0f}, Case{DType::kFP8E5M2, 1.0f, 1.0f},
                 Case{DType::kFP8E4M3, 0.5f, 0.25f}}) {
    for (bool decode : {false, true}) {
      for (int i = 0; ref.has("seq" + std::to_string(i) + ".input_ids"); ++i) {
        auto ids = ref.i32("seq" + std::to_string(i) + ".input_ids");
        if (decode && ids.size() > 48) ids.resize(48);
        auto want = run_model(**cm, ids, c.dt, c.ks, c.vs, decode);
        auto got = run_model(**gm, ids, c.dt, c.ks, c.vs, decode);
        auto bf16 = run_model(**gm, ids, DType::kBF16, 1.0f, 1.0f, decode);
        double gap = 0;
        const double e = nmse(got, want), agree = agreement(got, want, vocab, &gap);
        std::printf(
            "house-llama %s scales %.2f/%.2f %s seq%d (%zu tokens): nmse vs CPU fp8 %.3g, "
            "argmax agreement %.4f (worst gap %.3g); nmse of CPU fp8 vs CUDA bf16 KV %.3g\n",
            dtype_name(c.dt), c.ks, c.vs, decode ? "decode" : "prefill", i, ids.size(), e, agree,
            gap, nmse(want, bf16));
        EXPECT_LT(e, 2e-3);
        EXPECT_GE(agree, 0.8);
        EXPECT_LT(gap, 0.05);
      }
    }
  }
}

}  // namespace
}  // namespace strata::testing
