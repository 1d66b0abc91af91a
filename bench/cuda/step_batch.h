// One engine step's inputs built by hand, for benchmarks that time a model's forward outside the
// engine (offline_bench's breakdown, rank_step_bench): B decode sequences of context C, or one
// sequence's prefill of P tokens; and a KV pool of random bytes to run them against.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "arch/model.h"
#include "backend/cuda/cuda_backend.h"

namespace strata {

// Pages in order (sequence s owns one contiguous run) or scattered the way a long-running engine
// leaves them (a random permutation of the pool). fb points into the vectors: not copyable.
struct StepBatch {
  std::vector<int32_t> q_indptr{0}, kv_lens, page_indptr{0}, pages, pos, slots, tokens, rows;
  ForwardBatch fb;

  // Decode: B sequences of context C (the new token is the last of each); logits of every row.
  static std::unique_ptr<StepBatch> decode(int B, int C, int page, bool scattered) {
    auto b = std::make_unique<StepBatch>();
    const int pages_per_seq = (C + page) / page;
    b->pages.resize(size_t(B) * size_t(pages_per_seq));
    std::iota(b->pages.begin(), b->pages.end(), 0);
    if (scattered) std::shuffle(b->pages.begin(), b->pages.end(), std::mt19937(7));
    for (int s = 0; s < B; ++s) {
      b->q_indptr.push_back(s + 1);
      b->kv_lens.push_back(C);
      b->page_indptr.push_back((s + 1) * pages_per_seq);
      b->pos.push_back(C - 1);
      b->slots.push_back(b->pages[size_t(s * pages_per_seq + (C - 1) / page)] * page +
                         (C - 1) % page);
      b->tokens.push_back(s * 7 % 1000);
      b->rows.push_back(s);
    }
    b->finish(B, B, page);
    return b;
  }

  // Prefill: one sequence's first P tokens (an empty cache before them); the last row's logits.
  static std::unique_ptr<StepBatch> prefill(int P, int page) {
    auto b = std::make_unique<StepBatch>();
    const int n_pages = (P + page - 1) / page;
    b->pages.resize(size_t(n_pages));
    std::iota(b->pages.begin(), b->pages.end(), 0);
    b->q_indptr.push_back(P);
    b->kv_lens.push_back(P);
    b->page_indptr.push_back(n_pages);
    for (int i = 0; i < P; ++i) {
      b->pos.push_back(i);
      b->slots.push_back(b->pages[size_t(i / page)] * page + i % page);
      b->tokens.push_back(i * 7 % 1000);
    }
    b->rows.push_back(P - 1);
    b->finish(1, P, page);
    return b;
  }

 private:
  void finish(int seqs, int tokens_n, int page) {
    fb.token_ids = tokens.data();
    fb.attn = AttentionMetadata{.num_seqs = seqs,
                                .num_tokens = tokens_n,
                                .page_size = page,
                                .q_indptr = q_indptr.data(),
                                .kv_lens = kv_lens.data(),
                                .page_indptr = page_indptr.data(),
                                .page_indices = pages.data(),
                                .positions = pos.data(),
                                .slot_mapping = slots.data()};
    fb.logit_rows = rows.data();
    fb.num_logit_rows = int(rows.size());
  }
};

// A KV pool of `num_pages` pages of the model's layout in `dtype`, every byte random: attention
// reading a never-written (zeroed) pool runs faster than on real data (DRAM power).
inline std::unique_ptr<KvStorage> random_kv(cuda::CudaBackend& be, const Model& model, DType dtype,
                                            int64_t num_pages, int page) {
  KvLayout lay = model.kv_layout();
  lay.page_size = page;
  lay.num_pages = num_pages;
  lay.dtype = dtype;
  auto kv = be.alloc_kv(lay);
  for (int l = 0; l < lay.num_layers; ++l) {
    be.fill_random(kv->k(l), 100 + 2 * uint64_t(l), 0.5f);
    if (!kv->v(l).empty()) be.fill_random(kv->v(l), 101 + 2 * uint64_t(l), 0.5f);
  }
  return kv;
}

}  // namespace strata
