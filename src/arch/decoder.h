// DecoderModel: the pre-norm decoder stack every architecture here shares, written once —
// embedding; per layer input norm → attention → residual add + norm → MLP; final norm; logits of
// the requested rows. An architecture supplies the two blocks and its per-layer norms.
#pragma once

#include "arch/model.h"
#include "arch/rope.h"
#include "arch/tp.h"

namespace strata {

class DecoderModel : public Model {
 public:
  void forward(const ForwardBatch& batch, KvStorage& kv, float* logits) final;
  void forward_sample(const ForwardBatch& batch, KvStorage& kv, const SampleArgs& args) final;
  void forward_logits(const ForwardBatch& batch, KvStorage& kv,
                      const LogitsConsumer& consumer) final;
  // The token embedding table [vocab, hidden] on backend(), or null under tensor parallelism
  // (each rank holds a slice): what an EAGLE-3 drafter without its own table borrows
  // (arch/eagle3.h; the engine reaches it through dynamic_cast<const DecoderModel*>).
  const Tensor* input_embedding() const {
    return tp_.active() || !embed_ ? nullptr : &embed_->view();
  }

 protected:
  // rotary_dim: the dims rope rotates (the whole head for Llama, qk_rope_head_dim for MLA).
  DecoderModel(const ModelSpec& spec, Backend& backend, int rotary_dim)
      : Model(spec, backend), rotary_dim_(rotary_dim) {}

  virtual const DeviceTensor& input_norm(int layer) const = 0;  // [hidden]
  virtual const DeviceTensor& post_norm(int layer) const = 0;   // [hidden]
  // Each writes its block's output for the normalized hidden states h [tokens, hidden] to out.
  virtual void attention_block(int layer, const Tensor& h, const ForwardBatch& batch, KvStorage& kv,
                               const RopeArgs& rope, const Tensor& out) = 0;
  virtual void mlp_block(int layer, const Tensor& h, const Tensor& out) = 0;

  // Loads embed_, final_norm_ and lm_head_ (this rank's shards). A tied lm_head borrows the
  // embedding table's rows instead of holding a second copy.
  Status load_embedding_and_head(const WeightStore& ws);

  // Set by the architecture's load().
  DeviceTensorPtr embed_;       // [vocab, hidden]
  DeviceTensorPtr final_norm_;  // [hidden]
  LinearWeight lm_head_;        // [vocab, hidden] (the embedding when tied)
  RopeFrequencies rope_freqs_;  // for the model's context; dynamic NTK recomputes per batch
  // Tensor parallelism (tp = 1: inactive, no communicator call anywhere). When active, embed_ is
  // [vocab_shard + 1, hidden] (a zero row last), lm_head_ [vocab_shard, hidden], and the blocks
  // write this rank's partial sums, which forward() all-reduces.
  TpRank tp_;

 private:
  // The rope arguments of one batch; `dynamic` holds frequencies recomputed for it (dynamic NTK
  // grows the base once a sequence outgrows the original context).
  RopeArgs rope_args(const AttentionMetadata& attn, RopeFrequencies* dynamic) const;
  // Vocab-parallel embedding: this rank's rows (others' tokens read the zero row), all-reduced.
  void tp_embedding(const ForwardBatch& batch, const Tensor& out);
  // Vocab-parallel logits: this rank's [n, vocab_shard] columns, all-gathered; the full rows
  // are sampled on the device (sample_args_ set) or downloaded to `logits`. A worker rank passes
  // neither and only joins the gather.
  void tp_logits(const Tensor& rows, float* logits);

  // Copies `state` [t, hidden] into column block `block` of the capture buffer (a device copy:
  // nothing leaves the device until finish_capture).
  void capture_state(const Tensor& state, int block);
  // The one download of a step's captured rows to batch.captured (when asked for).
  void finish_capture(const ForwardBatch& batch);
  bool capturing_ = false;  // this forward captures (batch.captured set)

  // Set by forward_sample for the duration of its forward(): the logits are then sampled on the
  // device (sample_device_logits) instead of downloaded.
  const SampleArgs* sample_args_ = nullptr;
  void sample_device_logits(const Tensor& logits, const SampleArgs& args);
  // Set by forward_logits likewise: the logits are handed to it on the device.
  const LogitsConsumer* consumer_ = nullptr;

  int rotary_dim_;
};

}  // namespace strata
