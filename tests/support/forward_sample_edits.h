// Test support: a model's forward_sample with logit edits (penalties, logit_bias) against
// forward + the reference edits + the reference sampler on the same logits, for any backend.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "arch/model.h"
#include "backend/backend.h"
#include "core/dtype.h"
#include "engine/logit_edits.h"
#include "support/golden.h"

namespace strata::testing {

struct ForwardSampleEditsCounts {
  int rows = 0;
  int equal = 0;    // rows whose sampled id equals the reference's
  int changed = 0;  // rows where the edits changed the reference's choice
};

// Runs `n` random tokens of one sequence (pages of `page` tokens, KV in `kv_dtype`) through
// forward, then through forward_sample with edits on two rows of three (each row's top token
// penalized hard, two tokens biased; every other one also bans its top token and one more, as
// min_new_tokens does) and sampling on odd rows (temperature 0.8, top-k 50), keeping
// rows `keep`. Expects every sampled id to equal the reference's choice on the forward's logits
// after edit_logit_reference (rounded to bf16 when `edits_in_bf16`: the logits live as bf16 on the
// device), and the kept rows to be the raw logits. At least one row's choice must change.
inline ForwardSampleEditsCounts check_forward_sample_edits(Model& model, DType kv_dtype, int n,
                                                           int page, uint64_t seed,
                                                           const std::vector<int32_t>& keep,
                                                           bool edits_in_bf16) {
  std::mt19937_64 g(seed);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int32_t& id : ids) id = int32_t(g() % 8000);
  const int64_t vocab = model.spec().vocab_size;
  std::vector<float> logits;
  {
    SingleSequence seq(model, page, n, kv_dtype);
    logits = seq.step(ids, /*all_logits=*/true);
  }
  std::vector<SampleRowParams> params(static_cast<size_t>(n));
  std::vector<LogitEdit> edits;
  for (int r = 0; r < n; ++r) {
    if (r % 2)
      params[size_t(r)] = {.temperature = 0.8f,
                           .top_k = 50,
                           .uniform = std::uniform_real_distribution<double>(0, 1)(g)};
    if (r % 3 == 0) continue;  // rows without edits
    const float* row = logits.data() + size_t(r) * size_t(vocab);
    const int32_t top = int32_t(std::max_element(row, row + vocab) - row);
    OutputTokenCounts counts;
    counts.add(std::vector<int32_t>{top, top, int32_t(g() % 8000)});
    // Every other edited row bans its top token (min_new_tokens' -inf, merged with its penalty)
    // and one more.
    const std::vector<int32_t> banned =
        r % 2 == 0 ? std::vector<int32_t>{top, int32_t(g() % 8000)} : std::vector<int32_t>{};
    append_logit_edits(
        {.repetition_penalty = 1.8f,
         .presence_penalty = 1.0f,
         .frequency_penalty = 0.5f,
         .logit_bias = {{int32_t(g() % 4000), 3.0f}, {int32_t(4000 + g() % 4000), -2.0f}}},
        counts, r, banned, &edits);
  }
  std::vector<int32_t> got(size_t(n), -1);
  std::vector<float> kept(keep.size() * size_t(vocab));
  const SampleArgs args{.params = params.data(),
                        .token_ids = got.data(),
                        .keep_rows = keep.data(),
                        .num_keep = int(keep.size()),
                        .kept_logits = kept.data(),
                        .edits = edits.data(),
                        .num_edits = int64_t(edits.size())};
  {
    SingleSequence seq(model, page, n, kv_dtype);
    seq.step(ids, /*all_logits=*/true, &args);
  }
  std::vector<float> want_logits = logits;
  for (const LogitEdit& e : edits) {
    float& x = want_logits[size_t(e.row) * size_t(vocab) + size_t(e.token)];
    x = edit_logit_reference(x, e);
    if (edits_in_bf16) x = round_to_bf16(x);
  }
  ForwardSampleEditsCounts c{.rows = n};
  std::vector<std::pair<float, int32_t>> scratch;
  for (int r = 0; r < n; ++r) {
    const int32_t want = sample_row_reference(want_logits.data() + size_t(r) * size_t(vocab), vocab,
                                              params[size_t(r)], scratch);
    c.equal += got[size_t(r)] == want;
    EXPECT_EQ(got[size_t(r)], want) << "row " << r;
    c.changed += want != sample_row_reference(logits.data() + size_t(r) * size_t(vocab), vocab,
                                              params[size_t(r)], scratch);
  }
  EXPECT_GT(c.changed, 0) << "the edits were meant to change some choices";
  for (size_t k = 0; k < keep.size(); ++k) {
    int64_t differ = 0;
    for (int64_t v = 0; v < vocab; ++v)
      differ += kept[k * size_t(vocab) + size_t(v)] !=
                logits[size_t(keep[k]) * size_t(vocab) + size_t(v)];
    EXPECT_EQ(differ, 0) << "kept row " << k << ": logits differ from the forward's";
  }
  return c;
}

}  // namespace strata::testing
