// The EAGLE-3 drafter (issue 26): one Llama decoder layer that reads the target's features, run
// against the Backend op interface once for the CPU and CUDA alike. Its config and tensor names
// are model/eagle3_config.h's (SpecForge's); tools/eagle3_train.py trains it and is its PyTorch
// reference (tests/golden/eagle3 checks the two agree).
//
// One forward over T rows (each row: a token of the target vocabulary at a position):
//   x      = fc(target_features)          first draft step: the target's aux states [T, 3·H_t]
//          = prev_hidden                  later steps: hidden_out rows of an earlier forward [T, H]
//   h      = [input_layernorm(embed(token)) ; hidden_norm(x)]                       [T, 2H]
//   x     += o_proj(paged_attention(rope(q(h)), rope(k(h)), v(h)))   K/V written to the drafter's
//                                                                     KV at attn.slot_mapping
//   x     += mlp(post_attention_layernorm(x))
//   hidden_out = x;  logits = lm_head(norm(x)) over the draft vocabulary (rows asked for)
// As SpecForge and SGLang: row p of the first step pairs the target's states after token p with
// token p + 1 (the target's next token), at position p, and predicts token p + 2; a draft step
// feeds row p's hidden_out with the token it drafted, at position p + 1, and so on.
//
// KV: the drafter's own KvStorage (kv_layout(): one layer, Llama K/V widths), indexed by the same
// AttentionMetadata (page tables, slot mapping) as the target's for the same positions: give it
// the target's page ids. Attention is causal over the sequence's context like the target's.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "arch/rope.h"
#include "backend/attention_metadata.h"
#include "backend/backend.h"
#include "core/status.h"
#include "model/eagle3_config.h"

namespace strata {

class WeightStore;

// The inputs of one drafter forward. Exactly one of target_features and prev_hidden is set.
struct Eagle3Batch {
  const int32_t* token_ids = nullptr;  // host [attn.num_tokens]: target vocabulary ids
  AttentionMetadata attn;              // positions and page tables over the drafter's KV
  // [T, 3 · target_hidden_size] on backend(), activation dtype: per row the column blocks of the
  // aux layers' outputs in aux_layers() order (Model::set_capture's layout for those layers; the
  // capture's final-norm block is not part of it). Upload host rows with Backend::upload.
  const Tensor* target_features = nullptr;
  // [T, hidden_size] on backend(), activation dtype: hidden_out rows of an earlier forward.
  const Tensor* prev_hidden = nullptr;
  // Rows that need logits, and how many.
  const int32_t* logit_rows = nullptr;  // host [num_logit_rows]
  int num_logit_rows = 0;
};

class Eagle3Drafter {
 public:
  // Loads the drafter in `dir` onto `backend`. Its embeddings: its own embed_tokens.weight when it
  // ships one, else `target_embedding` (the target's table on the same backend, [vocab, H_t],
  // borrowed: it must outlive the drafter; DecoderModel::input_embedding()), else the table read
  // from `target_dir`'s checkpoint (give "" when not available). Errors: the config's
  // (eagle3_config.h), missing or misshapen tensors, a d2t mapping outside the vocabulary, no
  // embeddings.
  static StatusOr<std::unique_ptr<Eagle3Drafter>> load(const std::string& dir, Backend& backend,
                                                       const Tensor* target_embedding,
                                                       const std::string& target_dir);

  const Eagle3Spec& spec() const { return spec_; }
  Backend& backend() const { return *backend_; }
  int hidden_size() const { return spec_.layer.hidden_size; }
  int64_t draft_vocab_size() const { return spec_.draft_vocab_size; }
  // The target layers whose outputs make target_features, for a target of `target_layers`
  // layers (the config's eagle_aux_hidden_state_layer_ids or the default): the CaptureSpec the
  // target runs with.
  StatusOr<std::vector<int>> aux_layers(int target_layers) const {
    return eagle3_aux_layers(spec_, target_layers);
  }

  // The drafter's KV widths (num_pages, page_size and dtype are the caller's).
  KvLayout kv_layout() const;

  // Runs the batch: writes hidden_out [T, hidden_size] (on backend(), activation dtype; it may be
  // the tensor prev_hidden views) and float32 logits [num_logit_rows, draft_vocab_size] to host
  // `logits` (null: none downloaded). Writes the rows' K/V into `kv`.
  void forward(const Eagle3Batch& batch, KvStorage& kv, const Tensor& hidden_out, float* logits);
  // The same with the logits left on backend(): [num_logit_rows, draft_vocab_size] in the
  // activation dtype (null when num_logit_rows is 0), for an op that reads them where they are
  // (backend/top_k.h: a drafter's candidates without the rows' download).
  DeviceTensorPtr forward_device_logits(const Eagle3Batch& batch, KvStorage& kv,
                                        const Tensor& hidden_out);

  // The target vocabulary id of draft id `d` (d + d2t[d]).
  int32_t target_token(int32_t d) const { return d2t_target_[size_t(d)]; }
  // Target ids of draft ids, in place.
  void to_target_tokens(int32_t* ids, int n) const {
    for (int i = 0; i < n; ++i) ids[i] = target_token(ids[i]);
  }

 private:
  Eagle3Drafter(Eagle3Spec spec, Backend& backend) : spec_(std::move(spec)), backend_(&backend) {}
  Status load_weights(const WeightStore& ws, const Tensor* target_embedding,
                      const std::string& target_dir);
  // forward()'s work; the logits on the device when `logits` is set and there are logit rows.
  DeviceTensorPtr run(const Eagle3Batch& batch, KvStorage& kv, const Tensor& hidden_out,
                      bool logits);

  Eagle3Spec spec_;
  Backend* backend_;
  DeviceTensorPtr own_embed_;        // [vocab, H] when the drafter ships or loads its table
  Tensor embed_;                     // the table used: own_embed_ or the target's
  LinearWeight fc_;                  // [H, 3 · H_t]
  DeviceTensorPtr hidden_norm_;      // [H]
  DeviceTensorPtr input_norm_;       // [H]
  DeviceTensorPtr post_norm_;        // [H]
  LinearWeight qkv_;                 // [(heads + 2 kv_heads) · head_dim, 2H]
  LinearWeight o_proj_;              // [H, heads · head_dim]
  LinearWeight gate_up_;             // [2 · intermediate, H]
  LinearWeight down_;                // [H, intermediate]
  DeviceTensorPtr norm_;             // [H]
  LinearWeight lm_head_;             // [draft_vocab, H]
  std::vector<int32_t> d2t_target_;  // [draft_vocab]: the target id of each draft id
  RopeFrequencies rope_freqs_;
};

}  // namespace strata
