// Logit edits on the GPU (backend/cuda/sampling.cu edit_logits: the penalties and logit_bias of
// engine/logit_edits.h) against the CPU twin (edit_logit_reference): on bf16 logits every edited
// value must equal the reference's float32 result rounded to bf16, on float32 logits the
// reference's value, and every other logit must be untouched. Also: house-llama's forward_sample on
// CUDA with edits equals forward + the reference edits + the reference sampler, with the logprob
// rows the model's own (before the edits).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "arch/model.h"
#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "engine/logit_edits.h"

namespace strata {
namespace {

bool same(float a, float b) { return a == b || (std::isnan(a) && std::isnan(b)); }

// Random edits, each row naming distinct tokens; some rows none.
std::vector<LogitEdit> random_edits(std::mt19937_64& g, int rows, int64_t vocab) {
  std::vector<LogitEdit> edits;
  for (int r = 0; r < rows; ++r) {
    const int n = r % 4 == 0 ? 0 : int(g() % uint64_t(std::min<int64_t>(vocab, 300))) + 1;
    std::set<int32_t> tokens;
    while (int(tokens.size()) < n) tokens.insert(int32_t(g() % uint64_t(vocab)));
    for (int32_t t : tokens) {
      LogitEdit e{.row = r, .token = t};
      switch (g() % 4) {
        case 0:
          e.bias = std::uniform_real_distribution<float>(-100, 100)(g);
          break;  // logit_bias only
        case 1:
          e.scale = std::uniform_real_distribution<float>(0.2f, 2.0f)(g);
          break;  // repetition only
        default:
          e.subtract = std::uniform_real_distribution<float>(-2.0f, 6.0f)(g);
          e.scale = std::uniform_real_distribution<float>(0.2f, 2.0f)(g);
          e.bias = std::uniform_real_distribution<float>(-5, 5)(g);
      }
      edits.push_back(e);
    }
  }
  std::shuffle(edits.begin(), edits.end(), g);  // the order of edits must not matter
  return edits;
}

TEST(CudaLogitEdits, EqualTheReferenceOnBf16AndFloat32Logits) {
  auto gpu = make_cuda_backend();
  std::mt19937_64 g(17);
  for (int64_t vocab : {int64_t(128256), int64_t(4097), int64_t(5)}) {
    const int rows = 37;
    std::vector<float> logits(size_t(rows) * size_t(vocab));
    for (float& v : logits) v = round_to_bf16(std::normal_distribution<float>(0, 4)(g));
    logits[3] = NAN, logits[size_t(vocab)] = -INFINITY, logits[size_t(vocab) + 1] = INFINITY;
    std::vector<LogitEdit> edits = random_edits(g, rows, vocab);
    if (vocab > 2)
      edits.push_back(
          LogitEdit{.row = 1, .token = vocab > 5 ? int32_t(vocab - 1) : 2, .scale = 1.5f});
    for (DType dtype : {DType::kBF16, DType::kF32}) {
      Tensor host = Tensor::make(logits.data(), DType::kF32, {rows, vocab});
      auto dev = gpu->upload(host, dtype);
      gpu->edit_logits(*dev, edits.data(), int64_t(edits.size()));
      std::vector<float> got(logits.size());
      gpu->download_f32(*dev, got.data());
      std::vector<float> want = logits;
      for (const LogitEdit& e : edits) {
        float& x = want[size_t(e.row) * size_t(vocab) + size_t(e.token)];
        x = edit_logit_reference(x, e);
        if (dtype == DType::kBF16) x = round_to_bf16(x);
      }
      int64_t wrong = 0;
      for (size_t i = 0; i < want.size(); ++i)
        if (!same(got[i], want[i]) && ++wrong <= 5)
          ADD_FAILURE() << dtype_name(dtype) << " vocab " << vocab << " element " << i << ": got "
                        << got[i] << ", want " << want[i] << " (from " << logits[i] << ")";
      EXPECT_EQ(wrong, 0);
      std::printf("edit_logits %s vocab %lld: %zu edits, %lld wrong\n", dtype_name(dtype),
                  (long long)vocab, edits.size(), (long long)wrong);
    }
  }
}

// house-llama: forward_sample with edits on CUDA equals forward, the reference edits (bf16
// rounded, as the device stores them) and the reference sampler on the same device logits.
TEST(CudaLogitEdits, HouseLlamaForwardSampleAppliesEdits) {
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
  std::mt19937_64 g(5);
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
  std::vector<LogitEdit> edits;
  for (int r = 0; r < n; ++r) {
    if (r % 2)
      params[size_t(r)] = {.temperature = 0.8f,
                           .top_k = 50,
                           .uniform = std::uniform_real_distribution<double>(0, 1)(g)};
    if (r % 3 == 0) continue;
    const float* row = logits.data() + size_t(r) * size_t(vocab);
    const int32_t top = int32_t(std::max_element(row, row + vocab) - row);
    OutputTokenCounts counts;
    counts.add(std::vector<int32_t>{top, top, int32_t(g() % 8000)});
    append_logit_edits(
        {.repetition_penalty = 1.8f,
         .presence_penalty = 1.0f,
         .frequency_penalty = 0.5f,
         .logit_bias = {{int32_t(g() % 4000), 3.0f}, {int32_t(4000 + g() % 4000), -2.0f}}},
        counts, r, &edits);
  }
  std::vector<int32_t> got(n, -1), keep{1, 4, 47};
  std::vector<float> kept(keep.size() * size_t(vocab));
  model.forward_sample(b, *kv,
                       SampleArgs{.params = params.data(),
                                  .token_ids = got.data(),
                                  .keep_rows = keep.data(),
                                  .num_keep = int(keep.size()),
                                  .kept_logits = kept.data(),
                                  .edits = edits.data(),
                                  .num_edits = int64_t(edits.size())});
  std::vector<float> want_logits = logits;
  for (const LogitEdit& e : edits) {
    float& x = want_logits[size_t(e.row) * size_t(vocab) + size_t(e.token)];
    x = round_to_bf16(edit_logit_reference(x, e));
  }
  std::vector<std::pair<float, int32_t>> scratch;
  int equal = 0, changed = 0;
  for (int r = 0; r < n; ++r) {
    const int32_t want = sample_row_reference(want_logits.data() + size_t(r) * size_t(vocab), vocab,
                                              params[size_t(r)], scratch);
    equal += got[size_t(r)] == want;
    EXPECT_EQ(got[size_t(r)], want) << "row " << r;
    changed += want != sample_row_reference(logits.data() + size_t(r) * size_t(vocab), vocab,
                                            params[size_t(r)], scratch);
  }
  EXPECT_GT(changed, 0);
  for (size_t k = 0; k < keep.size(); ++k)
    for (int64_t c = 0; c < vocab; ++c)
      ASSERT_EQ(kept[k * size_t(vocab) + size_t(c)],
                logits[size_t(keep[k]) * size_t(vocab) + size_t(c)])
          << "kept row " << k;
  std::printf(
      "edit_logits house-llama forward_sample: %d of %d rows equal the reference, %d changed by "
      "the edits\n",
      equal, n, changed);
}

}  // namespace
}  // namespace strata
