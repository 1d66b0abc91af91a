// Verification of a draft tree by the target model (speculative decoding with
// --speculative-eagle-topk > 1; issue 26). The chain case is engine/spec/verify.h; read it first.
//
// The verify forward runs every node of the request's DraftTree (engine/spec/draft_tree.h): node i
// at rope position n + depth(i), attending to the committed prefix and its own ancestors. Row i of
// the logits is then the target's distribution p_i for the token after node i's root-to-node path,
// exactly what a plain decode of that path would get, and the ordinary sampler draws t_i ~ p_i
// with the draw of output position depth(i) (SamplerRng::peek(depth(i)); nodes of one depth share
// it, and at most one of them is on the accepted path).
//
// The rule for deterministic drafts at a node with children c_1..c_m (in node order): accept c_1
// with probability p(c_1); if rejected, remove c_1 from p and renormalize (p'), accept c_2 with
// probability p'(c_2); and so on; if every child is rejected, emit a token drawn from p without
// c_1..c_m, renormalized, and stop (SGLang's tree_speculative_sampling_target_only with a one-hot
// draft distribution; the multi-draft rule of SpecInfer / Miao et al. 2023). With S_j the mass
// p(c_1) + .. + p(c_j) of the first j children (distinct tokens), c_j is reached with probability
// Π_{l<j} (1 - S_l) / (1 - S_{l-1}) = 1 - S_{j-1} and then accepted with probability
// p(c_j) / (1 - S_{j-1}): overall p(c_j). The correction is p restricted to the other tokens, so
// every emitted token is distributed as p. Drawing t ~ p and following the child
// whose token is t (stopping with t when there is none) has exactly that law, so the engine uses
// it (accept_tree()): the target's own sampled row decides, as for a chain, and a seeded request
// gives plain decoding's tokens whatever was drafted. sequential_node_step() is the rule written
// out, against which tests check both.
//
// Greedy rows (t_i the argmax) make accept_tree() "follow the child equal to the target's argmax".
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "engine/spec/draft_tree.h"

namespace strata {

struct TreeAcceptance {
  // The accepted nodes from the root (path[0] == 0) to the deepest accepted draft: drafts
  // path[1..] are committed, at positions n+1..n+path.size()-1.
  std::vector<int32_t> path;
  // The target's token after the last accepted node (its row's sample): the bonus token when
  // that node is a leaf, else the correction.
  int32_t next_token = -1;

  // The number of accepted drafts.
  int32_t accepted() const { return int32_t(path.size()) - 1; }
  // The committed tokens of this step: the accepted drafts' tokens, then next_token.
  std::vector<int32_t> committed_tokens(const DraftTree& tree) const;
};

// Walks from the root: at node v, goes to the first child whose token is target_tokens[v]
// (the target's sampled token of row v); stops at a node with no such child.
// target_tokens.size() == tree.size().
TreeAcceptance accept_tree(const DraftTree& tree, std::span<const int32_t> target_tokens);

// The sequential rule at one node, written out: p is the target's distribution there (over the
// vocabulary, summing to 1), child_tokens the children's tokens in order, uniform() a source of
// U[0,1) draws. Returns the index in child_tokens of the accepted child, or -1 with *correction
// set to the token drawn from the residual.
int32_t sequential_node_step(std::span<const double> p, std::span<const int32_t> child_tokens,
                             const std::function<double()>& uniform, int32_t* correction);

// The KV rows to move after acceptance: accepted node path[k] was computed at slot n + path[k]
// and belongs at position n + k. Returns (from, to) offsets past n of the rows that move, in
// increasing order of `to` (from >= to always, so moving them in this order never overwrites a
// row still to be read).
std::vector<std::pair<int32_t, int32_t>> accepted_kv_moves(std::span<const int32_t> path);

}  // namespace strata
