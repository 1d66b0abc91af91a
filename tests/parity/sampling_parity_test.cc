// Sampling on the GPU (backend/cuda/sampling.cu) against the CPU twin (sample_row_reference) on
// the same bf16 logits and the same uniforms: greedy must be identical on every row (ties, NaN,
// infinities included); sampled rows must give the same token, except where the GPU's sums of
// the groups before a cut, taken in another order than the reference's sequential sums, put a
// boundary the other way. Every mismatch is checked to be such a boundary (the reference with
// the draw moved by a relative 1e-9, or top_p by 1e-6, gives the GPU's token; or the GPU's token
// is kept and at most 1e-9 of the kept mass away from the reference's, as at u = 1 - 2^-53 where
// the draw lands past the order-dependent rounding of the whole sum) and counted; any other
// mismatch fails. Also: house-llama's forward_sample on CUDA equals forward + the reference on
// the same logits, with the logprob rows downloaded in full.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "arch/model.h"
#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"

namespace strata {
namespace {

struct Rows {
  int64_t vocab = 0;
  std::vector<float> logits;  // [rows, vocab], bf16 values
  std::vector<SampleRowParams> params;
  int rows() const { return int(params.size()); }
};

std::vector<float> normal_row(std::mt19937_64& g, int64_t vocab, float sd) {
  std::normal_distribution<float> d(0.0f, sd);
  std::vector<float> v(static_cast<size_t>(vocab));
  for (float& x : v) x = round_to_bf16(d(g));
  return v;
}

// The reference's candidates in its order (value descending with NaN as -inf, id ascending),
// their weights, and how many it keeps (top-k, min-p, top-p).
struct Ranked {
  std::vector<int32_t> order;
  std::vector<double> w;
  size_t keep = 0;
};
Ranked rank(const float* row, int64_t vocab, const SampleRowParams& p) {
  Ranked r;
  auto val = [&](int32_t i) { return std::isnan(row[i]) ? -INFINITY : row[i]; };
  r.order.resize(size_t(vocab));
  std::iota(r.order.begin(), r.order.end(), 0);
  std::stable_sort(r.order.begin(), r.order.end(),
                   [&](int32_t a, int32_t b) { return val(a) > val(b); });
  if (p.top_k > 0 && p.top_k < vocab) r.order.resize(size_t(p.top_k));
  double total = 0;
  for (int32_t id : r.order) {
    r.w.push_back(float(std::exp(double(val(id) - val(r.order[0])) / p.temperature)));
    total += r.w.back();
  }
  while (r.keep < r.w.size() && !(p.min_p > 0 && r.w[r.keep] < p.min_p)) ++r.keep;
  if (p.top_p < 1.0f) {
    double mass = 0;
    for (size_t i = 0; i < r.keep; ++i)
      if ((mass += r.w[i] / total) >= p.top_p) {
        r.keep = i + 1;
        break;
      }
  }
  r.keep = std::max<size_t>(r.keep, 1);
  return r;
}

// Whether `got` is a kept candidate separated from the reference's `want` by at most `rel` of
// the kept mass: a draw at the very edge of two candidates' intervals (u near 1 puts it past
// sums whose rounding depends on their order).
bool adjacent_in_mass(const float* row, int64_t vocab, const SampleRowParams& p, int32_t got,
                      int32_t want, double rel) {
  const Ranked r = rank(row, vocab, p);
  const auto kept_end = r.order.begin() + long(r.keep);
  const auto ig = std::find(r.order.begin(), kept_end, got);
  const auto ic = std::find(r.order.begin(), kept_end, want);
  if (ig == kept_end || ic == kept_end) return false;
  size_t lo = size_t(std::min(ig, ic) - r.order.begin()),
         hi = size_t(std::max(ig, ic) - r.order.begin());
  double between = 0, kept = 0;
  for (size_t i = 0; i < r.keep; ++i) kept += r.w[i];
  for (size_t i = lo + 1; i < hi; ++i) between += r.w[i];
  return between <= rel * kept;
}

struct Outcome {
  int64_t rows = 0, equal = 0, boundary = 0, wrong = 0;
};

// Samples `rs` on the GPU and compares every row with the reference.
Outcome compare(Backend& gpu, const Rows& rs, const char* what) {
  Tensor host =
      Tensor::make(const_cast<float*>(rs.logits.data()), DType::kF32, {rs.rows(), rs.vocab});
  auto dev = gpu.upload(host, DType::kBF16);
  std::vector<int32_t> got(size_t(rs.rows()), -7);
  gpu.sample(*dev, rs.params.data(), got.data());
  Outcome o;
  std::vector<std::pair<float, int32_t>> scratch;
  for (int r = 0; r < rs.rows(); ++r) {
    const float* row = rs.logits.data() + size_t(r) * size_t(rs.vocab);
    const SampleRowParams& p = rs.params[size_t(r)];
    const int32_t want = sample_row_reference(row, rs.vocab, p, scratch);
    ++o.rows;
    if (got[size_t(r)] == want) {
      ++o.equal;
      continue;
    }
    bool near_boundary = false;
    if (!sample_is_greedy(p)) {
      for (double eps : {-1e-9, 1e-9}) {
        SampleRowParams q = p;
        q.uniform = std::min(std::max(p.uniform * (1 + eps), 0.0), std::nextafter(1.0, 0.0));
        near_boundary |= sample_row_reference(row, rs.vocab, q, scratch) == got[size_t(r)];
        q = p;
        q.top_p = float(double(p.top_p) * (1 + eps * 1e3));
        near_boundary |= sample_row_reference(row, rs.vocab, q, scratch) == got[size_t(r)];
      }
    }
    if (!sample_is_greedy(p) && !near_boundary)
      near_boundary = adjacent_in_mass(row, rs.vocab, p, got[size_t(r)], want, 1e-9);
    if (near_boundary) {
      ++o.boundary;
      std::printf(
          "sampling %s row %d: boundary case, gpu %d cpu %d (T %g top_k %d top_p %g "
          "min_p %g u %.17g)\n",
          what, r, got[size_t(r)], want, p.temperature, p.top_k, p.top_p, p.min_p, p.uniform);
    } else {
      ++o.wrong;
      ADD_FAILURE() << what << " row " << r << ": gpu " << got[size_t(r)] << " cpu " << want
                    << " (T " << p.temperature << " top_k " << p.top_k << " top_p " << p.top_p
                    << " min_p " << p.min_p << " u " << p.uniform << ")";
    }
  }
  std::printf("sampling %s: %lld rows, %lld equal, %lld boundary cases, %lld wrong\n", what,
              (long long)o.rows, (long long)o.equal, (long long)o.boundary, (long long)o.wrong);
  return o;
}

TEST(CudaSampling, GreedyIsTheHostArgmax) {
  auto gpu = make_cuda_backend();
  std::mt19937_64 g(1);
  for (int64_t vocab : {int64_t(128256), int64_t(4099), int64_t(8), int64_t(1)}) {
    Rows rs;
    rs.vocab = vocab;
    for (int r = 0; r < 300; ++r) {
      auto row = normal_row(g, vocab, r % 3 == 0 ? 0.5f : 3.0f);  // bf16: many ties
      const int64_t a = int64_t(g() % uint64_t(vocab)), b = int64_t(g() % uint64_t(vocab));
      switch (r % 10) {
        case 1:
          row[size_t(a)] = row[size_t(b)] = 40.0f;
          break;  // a planted tie at the max
        case 2:
          row[size_t(a)] = NAN;
          break;
        case 3:
          row[0] = NAN;
          break;  // element 0 NaN: 0 wins
        case 4:
          std::fill(row.begin(), row.end(), -INFINITY);
          break;
        case 5:
          row[size_t(a)] = INFINITY, row[size_t(b)] = INFINITY;
          break;
        case 6:
          std::fill(row.begin(), row.end(), 0.0f), row[size_t(a)] = -0.0f;
          break;
        case 7:
          std::fill(row.begin(), row.end(), NAN), row[size_t(a)] = -INFINITY;
          break;
        default:
          break;
      }
      rs.logits.insert(rs.logits.end(), row.begin(), row.end());
      SampleRowParams p;
      if (r % 4 == 1) p.temperature = 0.8f, p.top_k = 1;  // top_k 1 is greedy too
      rs.params.push_back(p);
    }
    const Outcome o = compare(*gpu, rs, ("greedy vocab " + std::to_string(vocab)).c_str());
    EXPECT_EQ(o.equal, o.rows);
  }
}

TEST(CudaSampling, SampledRowsMatchTheReference) {
  auto gpu = make_cuda_backend();
  std::mt19937_64 g(2);
  Outcome all;
  struct Shape {
    int64_t vocab;
    float sd;  // logit spread: large is peaked (realistic), small spreads mass over many ids
    int rows;
  };
  for (Shape s : {Shape{128256, 3.0f, 400}, Shape{128256, 0.3f, 100}, Shape{32000, 1.0f, 300},
                  Shape{4097, 2.0f, 600}, Shape{1000, 0.05f, 400}, Shape{5, 1.0f, 400}}) {
    Rows rs;
    rs.vocab = s.vocab;
    for (int r = 0; r < s.rows; ++r) {
      auto row = normal_row(g, s.vocab, s.sd);
      const int64_t a = int64_t(g() % uint64_t(s.vocab));
      if (r % 13 == 1) row[size_t(a)] = NAN;
      if (r % 13 == 2) row[size_t(a)] = -INFINITY;
      if (r % 13 == 3) row[size_t(a)] = INFINITY;                // greedy token
      if (r % 13 == 4) std::fill(row.begin(), row.end(), 1.5f);  // one group of every id
      if (r % 13 == 5) row[0] = -0.0f, row[size_t(a)] = 0.0f;
      rs.logits.insert(rs.logits.end(), row.begin(), row.end());
      SampleRowParams p;
      p.temperature = std::uniform_real_distribution<float>(0.1f, 2.0f)(g);
      const int kind = r % 7;
      if (kind == 1 || kind == 4) p.top_k = int32_t(1 + g() % 100);
      if (kind == 2) p.top_k = int32_t(g() % uint64_t(2 * s.vocab));
      if (kind == 3 || kind == 4) p.top_p = std::uniform_real_distribution<float>(0.01f, 1.0f)(g);
      if (kind == 5) p.min_p = std::uniform_real_distribution<float>(0.0f, 0.3f)(g);
      if (kind == 6) p.top_p = 0.9f, p.min_p = 0.05f, p.top_k = 50;
      p.uniform = std::uniform_real_distribution<double>(0.0, 1.0)(g);
      if (r % 50 == 7) p.uniform = 0.0;
      if (r % 50 == 8) p.uniform = std::nextafter(1.0, 0.0);
      rs.params.push_back(p);
    }
    const Outcome o = compare(
        *gpu, rs, ("vocab " + std::to_string(s.vocab) + " sd " + std::to_string(s.sd)).c_str());
    all.rows += o.rows, all.equal += o.equal, all.boundary += o.boundary, all.wrong += o.wrong;
  }
  std::printf("sampling total: %lld rows, %lld equal, %lld boundary cases (%.3f%%), %lld wrong\n",
              (long long)all.rows, (long long)all.equal, (long long)all.boundary,
              100.0 * double(all.boundary) / double(all.rows), (long long)all.wrong);
  EXPECT_EQ(all.wrong, 0);
  EXPECT_LE(all.boundary * 1000, all.rows);  // boundary cases are rare (< 0.1%)
}

// Exact boundaries the replay inside a group must get right: ties of equal mass.
TEST(CudaSampling, TopPAndDrawBoundariesInsideAGroup) {
  auto gpu = make_cuda_backend();
  Rows rs;
  rs.vocab = 4;
  const std::vector<float> row{2.0f, -5.0f, 2.0f, 2.0f};
  for (float top_p : {0.25f, 1.0f / 3.0f, 0.34f, 0.5f, 0.6666667f, 0.67f, 1.0f}) {
    for (double u : {0.0, 0.25, 0.3333333333333333, 0.5, 0.6666666666666666, 0.75, 0.999999}) {
      rs.logits.insert(rs.logits.end(), row.begin(), row.end());
      rs.params.push_back({.temperature = 1.0f, .top_p = top_p, .uniform = u});
    }
  }
  const Outcome o = compare(*gpu, rs, "group boundaries");
  EXPECT_EQ(o.equal, o.rows);
}

// Time of the op at an engine-sized decode batch (not a test of speed: printed for RESULTS).
TEST(CudaSampling, TimingAtBatch1000) {
  auto gpu = make_cuda_backend();
  auto& be = dynamic_cast<cuda::CudaBackend&>(*gpu);
  const int rows = 1000;
  const int64_t vocab = 128256;
  auto logits = be.alloc(DType::kBF16, {rows, vocab});
  be.fill_random(*logits, 9, 8.0f);
  std::vector<int32_t> ids(rows);
  for (int mode = 0; mode < 2; ++mode) {
    std::vector<SampleRowParams> params(rows);
    for (int r = 0; r < rows; ++r)
      if (mode == 1)
        params[size_t(r)] = {.temperature = 0.8f, .top_p = 0.95f, .uniform = (r + 0.5) / rows};
    gpu->sample(*logits, params.data(), ids.data());  // warm-up
    const int reps = 10;
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) gpu->sample(*logits, params.data(), ids.data());
    const double ms =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps * 1e3;
    std::printf("sampling timing: %d rows x %lld, %s: %.3f ms per call (ids only come back)\n",
                rows, (long long)vocab, mode ? "T 0.8 top_p 0.95" : "greedy", ms);
  }
  std::vector<float> host(size_t(rows) * size_t(vocab));
  auto t0 = std::chrono::steady_clock::now();
  gpu->download_f32(*logits, host.data());
  const double dl = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("sampling timing: the logits' download + bf16->f32 it replaces: %.3f ms\n", dl * 1e3);
}

// house-llama: forward_sample on CUDA equals forward + the reference on the same device logits.
TEST(CudaSampling, HouseLlamaForwardSample) {
  auto gpu = make_cuda_backend();
  auto m = load_model(std::string(STRATA_SHARED_DIR) + "/models/house-llama", *gpu);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  Model& model = **m;
  const int n = 48, page = 16;
  KvLayout layout = model.kv_layout();
  layout.page_size = page;
  layout.num_pages = (n + page - 1) / page;
  layout.dtype = DType::kBF16;
  auto kv = gpu->alloc_kv(layout);
  std::vector<int32_t> ids(n), pos(n), slots(n), rows(n), pages(size_t(layout.num_pages));
  std::mt19937_64 g(3);
  for (int i = 0; i < n; ++i)
    ids[size_t(i)] = int32_t(g() % 8000), pos[size_t(i)] = i, slots[size_t(i)] = i,
    rows[size_t(i)] = i;
  std::iota(pages.begin(), pages.end(), 0);
  int32_t q_indptr[2] = {0, n}, kv_lens[1] = {n}, page_indptr[2] = {0, int32_t(pages.size())};
  ForwardBatch b;
  b.token_ids = ids.data();
  b.attn = AttentionMetadata{.num_seqs = 1,
                             .num_tokens = n,
                             .page_size = page,
                             .q_indptr = q_indptr,
                             .kv_lens = kv_lens,
                             .page_indptr = page_indptr,
                             .page_indices = pages.data(),
                             .positions = pos.data(),
                             .slot_mapping = slots.data()};
  b.logit_rows = rows.data();
  b.num_logit_rows = n;
  const int64_t vocab = model.spec().vocab_size;
  std::vector<float> logits(size_t(n) * size_t(vocab));
  model.forward(b, *kv, logits.data());
  std::vector<SampleRowParams> params(n);
  for (int i = 0; i < n; ++i)
    if (i % 2)
      params[size_t(i)] = {.temperature = 0.9f,
                           .top_p = 0.9f,
                           .top_k = i % 3 ? 0 : 40,
                           .uniform = std::uniform_real_distribution<double>(0, 1)(g)};
  std::vector<int32_t> got(n, -1), keep{3, 0, 47};
  std::vector<float> kept(keep.size() * size_t(vocab));
  model.forward_sample(b, *kv,
                       SampleArgs{.params = params.data(),
                                  .token_ids = got.data(),
                                  .keep_rows = keep.data(),
                                  .num_keep = int(keep.size()),
                                  .kept_logits = kept.data()});
  std::vector<std::pair<float, int32_t>> scratch;
  int equal = 0;
  for (int i = 0; i < n; ++i) {
    const int32_t want = sample_row_reference(logits.data() + size_t(i) * size_t(vocab), vocab,
                                              params[size_t(i)], scratch);
    equal += got[size_t(i)] == want;
    EXPECT_EQ(got[size_t(i)], want) << "row " << i;
  }
  for (size_t k = 0; k < keep.size(); ++k)
    for (int64_t c = 0; c < vocab; ++c)
      ASSERT_EQ(kept[k * size_t(vocab) + size_t(c)],
                logits[size_t(keep[k]) * size_t(vocab) + size_t(c)])
          << "kept row " << k;
  std::printf("sampling house-llama forward_sample: %d of %d rows equal the reference\n", equal, n);
}

}  // namespace
}  // namespace strata
