#include "arch/decoder.h"

#include <algorithm>
#include <vector>

#include "core/capture_counters.h"
#include "core/check.h"
#include "model/weight_names.h"

namespace strata {

RopeArgs DecoderModel::rope_args(const AttentionMetadata& attn, RopeFrequencies* dynamic) const {
  const RopeFrequencies* freqs = &rope_freqs_;
  if (spec_.rope.type == RopeType::kDynamic) {
    int64_t max_len = 0;
    for (int s = 0; s < attn.num_seqs; ++s) max_len = std::max<int64_t>(max_len, attn.kv_lens[s]);
    *dynamic = dynamic_rope_frequencies(spec_.rope, spec_.max_position_embeddings, max_len);
    freqs = dynamic;
  }
  return RopeArgs{.inv_freq = freqs->inv_freq.data(),
                  .attention_factor = freqs->attention_factor,
                  .rotary_dim = rotary_dim_,
                  .offset = 0,
                  .interleaved = spec_.rope.interleaved};
}

void DecoderModel::forward(const ForwardBatch& batch, KvStorage& kv, float* logits) {
  Backend& be = *backend_;
  const int64_t t = batch.attn.num_tokens, hidden = spec_.hidden_size;
  const float eps = float(spec_.rms_norm_eps);
  const DType act = be.activation_dtype();
  RopeFrequencies dynamic;
  const RopeArgs rope = rope_args(batch.attn, &dynamic);

  capturing_ = batch.captured != nullptr && !capture_.empty();
  if (capturing_)
    CHECK_MSG(t <= capture_max_tokens_,
              "a step of {} tokens exceeds the capture buffer ({} tokens)", t, capture_max_tokens_);
  auto residual = be.alloc(act, {t, hidden});
  if (tp_.active()) {
    tp_embedding(batch, *residual);
  } else {
    be.embedding(batch.token_ids, int(t), *embed_, *residual);
  }
  trace(*residual, "embed");
  auto h = be.alloc(act, {t, hidden});
  auto branch = be.alloc(act, {t, hidden});  // output of the last attention/MLP block
  for (int l = 0; l < spec_.num_layers; ++l) {
    if (l == 0) {
      be.rms_norm(*residual, input_norm(l), eps, *h);
    } else {
      be.add_rms_norm(*branch, *residual, input_norm(l), eps, *h);
      // add_rms_norm left the residual stream after layer l - 1 in `residual`.
      if (capturing_ && capture_block(l - 1) >= 0) capture_state(*residual, capture_block(l - 1));
    }
    trace(*h, "attn_norm", l);
    attention_block(l, *h, batch, kv, rope, *branch);
    if (tp_.active()) tp_.comm->all_reduce_sum(*branch);
    trace(*branch, "attn_out", l);
    be.add_rms_norm(*branch, *residual, post_norm(l), eps, *h);
    trace(*h, "mlp_norm", l);
    mlp_block(l, *h, *branch);
    if (tp_.active()) tp_.comm->all_reduce_sum(*branch);
    trace(*branch, "mlp_out", l);
  }
  be.add_rms_norm(*branch, *residual, *final_norm_, eps, *h);
  trace(*h, "final_norm");
  if (capturing_) {
    const int last = spec_.num_layers - 1;
    if (capture_block(last) >= 0) capture_state(*residual, capture_block(last));
    if (capture_.final_norm) capture_state(*h, int(capture_.layers.size()));
  }
  const int n = batch.num_logit_rows;
  if (n == 0) return finish_capture(batch);
  auto rows = be.alloc(act, {n, hidden});
  be.gather_rows(*h, batch.logit_rows, n, *rows);
  if (tp_.active()) {
    tp_logits(*rows, logits);  // samples (or hands to consumer_) too
  } else {
    auto out = be.alloc(act, {n, spec_.vocab_size});
    be.linear(*rows, lm_head_, *out);
    if (sample_args_ != nullptr) {
      sample_device_logits(*out, *sample_args_);
    } else if (consumer_ != nullptr) {
      (*consumer_)(*out);  // eval-kv: the logits stay on the device
    } else {
      be.download_f32(*out, logits);
    }
  }
  // After sampling, which ends a CUDA graph step: the download is one eager copy of fixed rows.
  finish_capture(batch);
}

void DecoderModel::capture_state(const Tensor& state, int block) {
  const int64_t t = state.dim(0), hidden = spec_.hidden_size;
  backend_->copy_columns(state, 0, hidden, capture_buf_->view().slice_rows(0, t),
                         int64_t(block) * hidden);
}

void DecoderModel::finish_capture(const ForwardBatch& batch) {
  if (!capturing_) return;
  capturing_ = false;
  const Tensor rows = capture_buf_->view().slice_rows(0, batch.attn.num_tokens);
  // The step's work is done (sampling downloaded its ids): this times the copy alone.
  CaptureTimer timer(capture_counters().download, rows.nbytes());
  backend_->download(rows, batch.captured);
}

Status DecoderModel::load_embedding_and_head(const WeightStore& ws) {
  const ModelSpec& s = spec_;
  Backend& be = *backend_;
  const WeightNames names(s);
  const int64_t hidden = s.hidden_size;
  STRATA_ASSIGN_OR_RETURN(
      embed_, load_vocab_parallel_embedding(ws, be, tp_, WeightNames::weight(names.embed_tokens()),
                                            {s.vocab_size, hidden}));
  STRATA_ASSIGN_OR_RETURN(final_norm_,
                          load_weight(ws, be, WeightNames::weight(names.final_norm()), {hidden}));
  if (s.tie_word_embeddings) {
    // The embedding's first rows are this rank's vocab slice (the table's last row under tensor
    // parallelism is the zero row other ranks' tokens read).
    const int64_t rows = tp_.active() ? tp_.shard().vocab.size() : s.vocab_size;
    lm_head_.weight = std::make_unique<BorrowedTensor>(embed_->view().slice_rows(0, rows));
    lm_head_.format =
        LinearFormat{.format = WeightFormat::kDense, .dense_dtype = embed_->view().dtype};
    lm_head_.out = rows;
    lm_head_.in = hidden;
    return Status();
  }
  // A linear like any other: a quantized lm_head stays in its format on backends that keep it.
  STRATA_ASSIGN_OR_RETURN(
      lm_head_, load_sharded_linear(ws, be, tp_, {{names.lm_head(), s.vocab_size}}, hidden, false));
  return Status();
}

void DecoderModel::forward_sample(const ForwardBatch& batch, KvStorage& kv,
                                  const SampleArgs& args) {
  // Tensor parallel too: tp_logits assembles the full rows on rank 0's device and samples there.
  sample_args_ = &args;
  forward(batch, kv, nullptr);
  sample_args_ = nullptr;
}

void DecoderModel::forward_logits(const ForwardBatch& batch, KvStorage& kv,
                                  const LogitsConsumer& consumer) {
  consumer_ = &consumer;
  forward(batch, kv, nullptr);
  consumer_ = nullptr;
}

void DecoderModel::sample_device_logits(const Tensor& logits, const SampleArgs& args) {
  Backend& be = *backend_;
  // Only the rows that need logprobs come back in full, as the model computed them: copied
  // before the edits when there are any, else after sample() (which ends a graph step).
  DeviceTensorPtr kept;
  auto keep = [&] {
    kept = be.alloc(logits.dtype, {args.num_keep, logits.dim(1)});
    be.gather_rows(logits, args.keep_rows, args.num_keep, *kept);
  };
  if (args.num_edits > 0) {
    if (args.num_keep > 0) keep();
    be.edit_logits(logits, args.edits, args.num_edits);
  }
  be.sample(logits, args.params, args.token_ids);
  if (args.num_keep == 0) return;
  if (!kept) keep();
  be.download_f32(*kept, args.kept_logits);
}

void DecoderModel::tp_embedding(const ForwardBatch& batch, const Tensor& out) {
  const Range vocab = tp_.shard().vocab;
  const int t = batch.attn.num_tokens;
  std::vector<int32_t> local(static_cast<size_t>(t));
  for (int i = 0; i < t; ++i) {
    const int32_t id = batch.token_ids[i];
    local[size_t(i)] =
        id >= vocab.begin && id < vocab.end ? int32_t(id - vocab.begin) : int32_t(vocab.size());
  }
  backend_->embedding(local.data(), t, *embed_, out);
  tp_.comm->all_reduce_sum(out);
}

void DecoderModel::tp_logits(const Tensor& rows, float* logits) {
  Backend& be = *backend_;
  const int64_t n = rows.dim(0), vocab = spec_.vocab_size;
  const int tp = tp_.size();
  const DType act = be.activation_dtype();
  // Ranks' vocab slices may differ by one row (uneven plans): gather equal [n, widest] blocks.
  int64_t widest = 0;
  for (int r = 0; r < tp; ++r) widest = std::max(widest, tp_.plan->rank(r).vocab.size());
  const int64_t mine = tp_.shard().vocab.size();
  auto part = be.alloc(act, {n, widest});
  if (mine == widest) {
    be.linear(rows, lm_head_, *part);
  } else {
    auto narrow = be.alloc(act, {n, mine});
    be.linear(rows, lm_head_, *narrow);
    be.copy_columns(*narrow, 0, mine, *part, 0);
  }
  auto all = be.alloc(act, {tp, n, widest});
  tp_.comm->all_gather(*part, *all);
  // A worker rank's forward (logits null, nothing to sample) only joins the gather: the rows
  // are wanted on rank 0 alone, so nothing comes back to this rank's host.
  if (logits == nullptr && sample_args_ == nullptr && consumer_ == nullptr) return;
  // The full rows [n, vocab] on the device: rank r's block [n, widest] holds its vocab columns v.
  auto full = be.alloc(act, {n, vocab});
  for (int r = 0; r < tp; ++r) {
    const Range v = tp_.plan->rank(r).vocab;
    be.copy_columns(all->view().slice_rows(r, r + 1).reshape({n, widest}), 0, v.size(), *full,
                    v.begin);
  }
  if (sample_args_ != nullptr) return sample_device_logits(*full, *sample_args_);
  if (consumer_ != nullptr) return (*consumer_)(*full);
  be.download_f32(*full, logits);
}

}  // namespace strata
