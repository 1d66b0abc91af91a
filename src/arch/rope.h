// Rope frequencies for every scaling variant, computed as Hugging Face transformers does
// (modeling_rope_utils): inverse frequencies in float32 plus an attention factor that scales
// cos and sin (YaRN).
#pragma once

#include <vector>

#include "model/spec.h"

namespace strata {

struct RopeFrequencies {
  std::vector<float> inv_freq;  // [rotary_dim / 2]
  float attention_factor = 1.0f;
};

// `max_position_embeddings` is the model's (scaled) context; used by yarn and dynamic.
RopeFrequencies compute_rope_frequencies(const RopeSpec& rope, int64_t max_position_embeddings);

// Dynamic NTK: frequencies for a batch whose largest position + 1 is `seq_len` (HF recomputes
// the base once the sequence outgrows the original context).
RopeFrequencies dynamic_rope_frequencies(const RopeSpec& rope, int64_t max_position_embeddings,
                                         int64_t seq_len);

// YaRN's mscale: 0.1 · m · ln(scale) + 1 for scale > 1, else 1.
double yarn_get_mscale(double scale, double mscale);

}  // namespace strata
