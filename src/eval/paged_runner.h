// Runs a Model over a paged KV pool for evaluation: several sequences, each with its own pages
// (handed out interleaved, so page tables matter), teacher-forced chunk by chunk or decoded
// greedily. Each step is planned by the engine's BatchPlan code (engine/slice_plan.h) and run by
// the engine's forward of a plan (engine/plan_forward.h, what ModelRunner runs too); what eval
// leaves out is the scheduler, the sampler and the radix cache: eval-kv controls the batch
// composition itself (the noise floor depends on it). Engine-thread-style: one caller at a time.
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "arch/model.h"
#include "engine/batch_plan.h"
#include "engine/kv_config.h"

namespace strata {

class PagedRunner {
 public:
  // Room for `max_seqs` sequences of up to `max_len` tokens, KV stored as `kv` says.
  PagedRunner(Model& model, const KvCacheConfig& kv, int page_size, int max_seqs, int max_len);

  // Forgets every sequence's tokens (pages are reused; no clearing needed: rows are rewritten
  // before they are read).
  void reset();
  int32_t length(int seq) const { return lens_[size_t(seq)]; }

  // One forward step: chunk i appends chunks[i].second to sequence chunks[i].first (distinct
  // sequences). Returns float32 logits [total new tokens, vocab] of every new token in chunk
  // order when all_logits, else of each chunk's last token [chunks, vocab].
  std::vector<float> step(const std::vector<std::pair<int, std::vector<int32_t>>>& chunks,
                          bool all_logits);
  // The same step with every new token's logits [total new tokens, vocab] handed to `consumer`
  // on the model's device (Model::forward_logits): nothing full-vocabulary comes back.
  void step_on_device(const std::vector<std::pair<int, std::vector<int32_t>>>& chunks,
                      const Model::LogitsConsumer& consumer);

  // Teacher forcing of one sequence from empty, `chunk` tokens per step: logits [ids, vocab].
  std::vector<float> prefill_all(int seq, const std::vector<int32_t>& ids, int chunk);
  // Prefills `prompt` into sequence `seq` (from empty) and decodes `new_tokens` greedily.
  std::vector<int32_t> greedy(int seq, const std::vector<int32_t>& prompt, int new_tokens,
                              int chunk);

  KvStorage& kv() { return *kv_; }
  int64_t vocab() const { return model_.spec().vocab_size; }

 private:
  // The step's plan, appending each chunk to its sequence.
  BatchPlan plan_step(const std::vector<std::pair<int, std::vector<int32_t>>>& chunks,
                      bool all_logits);

  Model& model_;
  int page_size_, max_seqs_, pages_per_seq_;
  std::vector<int32_t> lens_;
  std::vector<int32_t> pages_;  // [max_seqs, pages_per_seq]: page ids of each sequence
  std::unique_ptr<KvStorage> kv_;
};

}  // namespace strata
