// Absorbed MLA (arch/mla.h over the backend ops) against the naive form computed here in double:
// per head, K = [W_UK_h c | k_rope] and V = W_UV_h c materialized from the latent c, causal softmax
// attention per sequence. Rope is applied the way transformers does (for rope_interleave: the
// pair-deinterleaving permutation, then rotate_half), independently of the backend's rope.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "arch/mla.h"

namespace strata {
namespace {

constexpr MlaDims kDims{.num_heads = 3,
                        .kv_lora_rank = 12,
                        .qk_nope_head_dim = 8,
                        .qk_rope_head_dim = 6,
                        .v_head_dim = 5};
constexpr float kScale = 0.37f;
constexpr float kAttentionFactor = 1.1f;  // YaRN-style cos/sin multiplier
constexpr float kEps = 1e-6f;

std::vector<float> randn(std::mt19937& rng, size_t n, float stddev = 1.0f) {
  std::normal_distribution<float> d(0.0f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// transformers' rope on one vector of rope dims (returned in its layout: permuted when
// interleaved, which leaves every q·k dot product unchanged).
std::vector<double> hf_rope(const float* x, int dim, int pos, const std::vector<float>& inv_freq,
                            bool interleaved) {
  std::vector<double> v(static_cast<size_t>(dim)), out(static_cast<size_t>(dim));
  const int half = dim / 2;
  for (int i = 0; i < dim; ++i) v[size_t(i)] = x[i];
  if (interleaved)  // view(d/2, 2).transpose: [x0, x2, x4, ..., x1, x3, x5, ...]
    for (int i = 0; i < half; ++i) v[size_t(i)] = x[2 * i], v[size_t(half + i)] = x[2 * i + 1];
  for (int i = 0; i < dim; ++i) {
    const double angle = double(float(pos) * inv_freq[size_t(i % half)]);
    const double c = std::cos(angle) * kAttentionFactor, s = std::sin(angle) * kAttentionFactor;
    const double rot = i < half ? -v[size_t(i + half)] : v[size_t(i - half)];
    out[size_t(i)] = v[size_t(i)] * c + rot * s;
  }
  return out;
}

struct Token {
  int seq;
  int pos;
  std::vector<float> q;     // [heads, nope + rope], before rope
  std::vector<float> kv_a;  // [rank + rope], before norm and rope
};

// (interleaved rope pairs, the inputs through Backend::mla_attention_inputs: mla_prepare_attention
// then mla_absorbed_attention_latent, as arch/deepseek.cc runs them, rather than op by op).
class MlaAbsorbed : public ::testing::TestWithParam<std::tuple<bool, bool>> {};

TEST_P(MlaAbsorbed, MatchesNaiveAttention) {
  const auto [interleaved, one_op] = GetParam();
  const MlaDims d = kDims;
  const int heads = d.num_heads, rank = d.kv_lora_rank, nope = d.qk_nope_head_dim;
  const int rope_dim = d.qk_rope_head_dim, v = d.v_head_dim, qd = d.q_head_dim();
  std::mt19937 rng(1234);
  auto be = make_cpu_backend();

  auto kv_b = randn(rng, size_t(heads * (nope + v) * rank), 0.3f);
  auto norm_w = randn(rng, size_t(rank), 0.5f);
  for (float& w : norm_w) w += 1.0f;
  std::vector<float> inv_freq(static_cast<size_t>(rope_dim / 2));
  for (int i = 0; i < rope_dim / 2; ++i)
    inv_freq[size_t(i)] = std::pow(10000.0f, -2.0f * i / rope_dim);
  const MlaAbsorbedWeights w =
      split_kv_b(*be, Tensor::make(kv_b.data(), DType::kF32, {heads * (nope + v), rank}), d);
  auto norm = be->upload(Tensor::make(norm_w.data(), DType::kF32, {rank}), DType::kF32);
  const RopeArgs rope{.inv_freq = inv_freq.data(),
                      .attention_factor = kAttentionFactor,
                      .rotary_dim = rope_dim,
                      .offset = 0,
                      .interleaved = interleaved};

  // Two sequences; pages handed out interleaved and out of order.
  const int page_size = 2, num_pages = 12;
  KvLayout layout;
  layout.num_layers = 1;
  layout.num_pages = num_pages;
  layout.page_size = page_size;
  layout.k_dim = d.cache_dim();
  auto kv = be->alloc_kv(layout);
  const std::vector<int32_t> page_indices = {7, 2, 9, 0, 5, /*seq 1:*/ 11, 3, 8, 1, 6};
  const std::vector<int32_t> page_indptr = {0, 5, 10};

  std::vector<Token> history;  // every token so far, for the naive side
  const std::vector<std::pair<int, int>> steps[2] = {{{0, 4}, {0, 2}}, {{4, 7}, {2, 5}}};
  for (const auto& step : steps) {
    std::vector<Token> batch;
    std::vector<int32_t> q_indptr = {0}, kv_lens, positions, slots;
    for (int s = 0; s < 2; ++s) {
      for (int p = step[size_t(s)].first; p < step[size_t(s)].second; ++p) {
        batch.push_back({s, p, randn(rng, size_t(heads * qd)), randn(rng, size_t(d.cache_dim()))});
        positions.push_back(p);
        slots.push_back(page_indices[size_t(page_indptr[size_t(s)] + p / page_size)] * page_size +
                        p % page_size);
      }
      q_indptr.push_back(int32_t(batch.size()));
      kv_lens.push_back(step[size_t(s)].second);
    }
    const int t = int(batch.size());
    AttentionMetadata meta{.num_seqs = 2,
                           .num_tokens = t,
                           .page_size = page_size,
                           .q_indptr = q_indptr.data(),
                           .kv_lens = kv_lens.data(),
                           .page_indptr = page_indptr.data(),
                           .page_indices = page_indices.data(),
                           .positions = positions.data(),
                           .slot_mapping = slots.data()};
    // Absorbed path through the backend.
    auto q = be->alloc(DType::kF32, {t, heads, qd});
    auto kv_a = be->alloc(DType::kF32, {t, d.cache_dim()});
    for (int i = 0; i < t; ++i) {
      std::copy(batch[size_t(i)].q.begin(), batch[size_t(i)].q.end(),
                q->view().ptr<float>() + i * heads * qd);
      std::copy(batch[size_t(i)].kv_a.begin(), batch[size_t(i)].kv_a.end(),
                kv_a->view().ptr<float>() + i * d.cache_dim());
    }
    auto out = be->alloc(DType::kF32, {t, heads, v});
    if (one_op) {
      auto q_latent = be->alloc(DType::kF32, {t, heads, d.cache_dim()});
      mla_prepare_attention(*be, d, *kv_a, *norm, mla_inputs_args(d, kEps, rope), *q, *q_latent,
                            *kv, 0, meta);
      mla_absorbed_attention_latent(*be, d, w, kScale, *q, *q_latent, *kv, 0, meta, *out);
    } else {
      RopeArgs q_rope = rope;
      q_rope.offset = nope;
      be->rope(*q, positions.data(), q_rope);
      mla_make_cache_rows(*be, d, *kv_a, *norm, kEps, positions.data(), rope);
      be->kv_write(*kv, 0, *kv_a, Tensor{}, meta);
      mla_absorbed_attention(*be, d, w, kScale, *q, *kv, 0, meta, *out);
    }

    history.insert(history.end(), batch.begin(), batch.end());
    // Naive path in double.
    double max_err = 0, max_ref = 0;
    for (int i = 0; i < t; ++i) {
      const Token& tok = batch[size_t(i)];
      for (int h = 0; h < heads; ++h) {
        const float* qh = tok.q.data() + h * qd;
        const auto q_pe = hf_rope(qh + nope, rope_dim, tok.pos, inv_freq, interleaved);
        std::vector<double> scores, values;
        for (const Token& ctx : history) {
          if (ctx.seq != tok.seq || ctx.pos > tok.pos) continue;
          double ss = 0;
          for (int r = 0; r < rank; ++r) ss += double(ctx.kv_a[size_t(r)]) * ctx.kv_a[size_t(r)];
          const double inv = 1.0 / std::sqrt(ss / rank + kEps);
          std::vector<double> c(static_cast<size_t>(rank));
          for (int r = 0; r < rank; ++r)
            c[size_t(r)] = ctx.kv_a[size_t(r)] * inv * norm_w[size_t(r)];
          const auto k_pe =
              hf_rope(ctx.kv_a.data() + rank, rope_dim, ctx.pos, inv_freq, interleaved);
          const float* block = kv_b.data() + h * (nope + v) * rank;
          double dot = 0;
          for (int n = 0; n < nope; ++n) {
            double k_n = 0;
            for (int r = 0; r < rank; ++r) k_n += block[n * rank + r] * c[size_t(r)];
            dot += qh[n] * k_n;
          }
          for (int j = 0; j < rope_dim; ++j) dot += q_pe[size_t(j)] * k_pe[size_t(j)];
          scores.push_back(dot * kScale);
          for (int j = 0; j < v; ++j) {
            double vj = 0;
            for (int r = 0; r < rank; ++r) vj += block[(nope + j) * rank + r] * c[size_t(r)];
            values.push_back(vj);
          }
        }
        const double mx = *std::max_element(scores.begin(), scores.end());
        double sum = 0;
        for (double& s : scores) sum += s = std::exp(s - mx);
        for (int j = 0; j < v; ++j) {
          double o = 0;
          for (size_t c = 0; c < scores.size(); ++c)
            o += scores[c] / sum * values[c * size_t(v) + size_t(j)];
          const double got = out->view().ptr<float>()[(i * heads + h) * v + j];
          max_err = std::max(max_err, std::fabs(got - o));
          max_ref = std::max(max_ref, std::fabs(o));
        }
      }
    }
    std::printf("interleaved %d, one op %d: rel max error %.3g\n", int(interleaved), int(one_op),
                max_err / max_ref);
    EXPECT_GT(max_ref, 0.1);
    EXPECT_LT(max_err / max_ref, 1e-5) << "interleaved " << interleaved;
  }
}

INSTANTIATE_TEST_SUITE_P(Rope, MlaAbsorbed,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) ? "interleaved" : "halves") +
                                  (std::get<1>(info.param) ? "_one_op" : "_op_by_op");
                         });

TEST(MlaSplit, KvBLayout) {
  // kv_b rows per head: nope rows of W_UK, then v rows of W_UV.
  const MlaDims d{.num_heads = 2,
                  .kv_lora_rank = 3,
                  .qk_nope_head_dim = 2,
                  .qk_rope_head_dim = 2,
                  .v_head_dim = 1};
  std::vector<float> kv_b(static_cast<size_t>(2 * 3 * 3));
  for (size_t i = 0; i < kv_b.size(); ++i) kv_b[i] = float(i);
  auto be = make_cpu_backend();
  auto w = split_kv_b(*be, Tensor::make(kv_b.data(), DType::kF32, {6, 3}), d);
  const float* uk = w.w_uk->view().ptr<float>();  // [2, 3, 2]
  const float* uv = w.w_uv->view().ptr<float>();  // [2, 1, 3]
  // Head 1, W_UK row n=1 is kv_b row 4; w_uk[1, r, 1] = kv_b[4, r].
  for (int r = 0; r < 3; ++r) EXPECT_EQ(uk[(1 * 3 + r) * 2 + 1], kv_b[size_t(4 * 3 + r)]);
  // Head 1, W_UV row 0 is kv_b row 5.
  for (int r = 0; r < 3; ++r) EXPECT_EQ(uv[3 + r], kv_b[size_t(5 * 3 + r)]);
}

}  // namespace
}  // namespace strata
