// Verification of draft tokens by the target model (speculative decoding, issue 26).
//
// A decoding request with drafts d1..dk runs [last token, d1..dk] at positions n..n+k in the
// target's forward; row i (0-based) of its logits is the target's distribution p_i for position
// n+1+i given the committed tokens and d1..di. Every row gets exactly what a plain decode of that
// prefix would get (the request's temperature/top-k/top-p/min-p, its penalties counting d1..di
// as output, its logit_bias, the draw of its output position), and is sampled by the ordinary
// sampler (engine/sampler.h): t_i ~ p_i.
//
// The general rule, for a draft token d drawn from a proposal q_i: accept d with probability
// min(1, p_i(d) / q_i(d)); on rejection emit a token drawn from the residual
// norm(max(0, p_i - q_i)) and stop. Every emitted token is then distributed exactly as p_i
// (Leviathan et al. 2023, Chen et al. 2023). Our drafters (NGRAM, EAGLE-3 chain at topk 1)
// propose deterministically: q_i is a point mass on d, so accept with probability p_i(d), and the
// residual is p_i with d removed, renormalized. Sampling t_i ~ p_i and accepting iff t_i == d is
// exactly that: P(accept) = p_i(d), and given t_i != d, t_i is distributed as p_i without d,
// renormalized; so the rejected row's own sample is the correction token. Greedy rows (t_i the
// argmax) make this "the longest prefix where the target's argmax equals the draft". When all k
// drafts are accepted, row k's sample is the bonus token.
//
// So a step commits d1..da then t_a, where a is the first i with t_i != d_{i+1} (or k). Draft
// trees (topk > 1) follow the same rule node by node: engine/spec/tree_verify.h. A stochastic
// drafter would need the general rule with q; not built.
//
// Draws: row i uses the draw of the request's random stream that plain decoding would use for
// the same output position (SamplerRng::peek), and a step takes only the draws of the tokens it
// keeps. The output is then the same function of the stream as plain decoding's: a seeded request
// gives the same tokens with or without speculation, in any batch, whatever was drafted (on a
// batch-invariant backend). The law is unchanged: whether row i is used depends only on rows
// 0..i-1's draws, so a draw is never reused after it decided anything.
#pragma once

#include <cstdint>
#include <span>

namespace strata {

// The number of drafts accepted: the length of the longest prefix of `drafts` equal to
// `target_tokens` (the target's sampled token of each row; target_tokens.size() ==
// drafts.size() + 1). The step then commits drafts[0..a) and target_tokens[a].
inline int32_t accepted_drafts(std::span<const int32_t> target_tokens,
                               std::span<const int32_t> drafts) {
  int32_t a = 0;
  while (size_t(a) < drafts.size() && target_tokens[size_t(a)] == drafts[size_t(a)]) ++a;
  return a;
}

}  // namespace strata
