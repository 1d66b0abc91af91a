#include "arch/decoder.h"

#include <algorithm>

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

  auto residual = be.alloc(act, {t, hidden});
  be.embedding(batch.token_ids, int(t), *embed_, *residual);
  trace(*residual, "embed");
  auto h = be.alloc(act, {t, hidden});
  auto branch = be.alloc(act, {t, hidden});  // output of the last attention/MLP block
  for (int l = 0; l < spec_.num_layers; ++l) {
    if (l == 0) {
      be.rms_norm(*residual, input_norm(l), eps, *h);
    } else {
      be.add_rms_norm(*branch, *residual, input_norm(l), eps, *h);
    }
    trace(*h, "attn_norm", l);
    attention_block(l, *h, batch, kv, rope, *branch);
    trace(*branch, "attn_out", l);
    be.add_rms_norm(*branch, *residual, post_norm(l), eps, *h);
    trace(*h, "mlp_norm", l);
    mlp_block(l, *h, *branch);
    trace(*branch, "mlp_out", l);
  }
  be.add_rms_norm(*branch, *residual, *final_norm_, eps, *h);
  trace(*h, "final_norm");
  const int n = batch.num_logit_rows;
  if (n == 0) return;
  auto rows = be.alloc(act, {n, hidden});
  be.gather_rows(*h, batch.logit_rows, n, *rows);
  auto out = be.alloc(act, {n, spec_.vocab_size});
  be.linear(*rows, lm_head_, *out);
  be.download_f32(*out, logits);
}

}  // namespace strata
