// DraftTree: the draft a tree drafter proposes for one request (EAGLE with
// --speculative-eagle-topk K > 1; issue 26), and DraftTreeBuilder, EAGLE's construction of it from
// per-step top-k candidates.
//
// Node 0 is the request's last committed token (position n = kv_len); every other node is a draft
// token whose parent comes before it (parents[i] < i), so node order is a topological order and
// depths never decrease along it. Several nodes may share a depth. In the verify forward node i
// takes KV slot n + i (node order past kv_len), rope position n + depth(i), and attends to the
// committed prefix plus its own ancestors and itself (ancestor_mask()). A chain is the tree whose
// node i has parent i - 1.
//
// Plain data, no model: the engine thread builds one per request per step; costs are O(nodes²)
// at most (nodes <= 64).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace strata {

// The most nodes a tree may have: a node's ancestor set is one 64-bit word
// (AttentionMetadata::tree_mask).
inline constexpr int kMaxDraftTreeNodes = 64;

struct DraftTree {
  std::vector<int32_t> tokens;   // [nodes] node 0: the last committed token
  std::vector<int32_t> parents;  // [nodes] parents[0] = -1; parents[i] < i otherwise
  std::vector<int32_t> depths;   // [nodes] depths[0] = 0; depths[i] = depths[parents[i]] + 1

  int32_t size() const { return int32_t(tokens.size()); }
  // The number of draft tokens (nodes other than the root).
  int32_t num_drafts() const { return size() - 1; }

  // A tree of just the root.
  static DraftTree root_only(int32_t root_token);
  // The chain root → drafts[0] → drafts[1] → ...
  static DraftTree chain(int32_t root_token, std::span<const int32_t> drafts);
  // Appends a node under `parent` and returns its index. CHECKs parent < size().
  int32_t add(int32_t parent, int32_t token);

  // Bit j of word i is set iff node j is node i or one of its ancestors: the new tokens node i
  // attends to in the verify forward. [nodes]; CHECKs size() <= kMaxDraftTreeNodes.
  std::vector<uint64_t> ancestor_mask() const;
  // The children of `node`, in node order.
  std::vector<int32_t> children(int32_t node) const;
  // The nodes from the root to `node`, both included (root first).
  std::vector<int32_t> path_to(int32_t node) const;
  // The tokens of path_to(node) without the root: the drafts a chain would hold for that node.
  std::vector<int32_t> path_tokens(int32_t node) const;
  // CHECKs the invariants above (parents before children, depths, size).
  void check() const;
};

// EAGLE's tree construction (the EAGLE-2 dynamic tree as SGLang's eagle worker builds it):
//   step 0: the drafter scores the root's continuations; its topk best become depth-1 nodes,
//           each scored by its log-probability;
//   step s > 0: the frontier (the topk best nodes created at step s-1) is expanded: each frontier
//           node gets its topk best continuations, scored by the node's score plus their
//           log-probability (the path's cumulative log-probability); of these topk · topk new
//           nodes, the topk best form the next frontier;
//   finish: of every node created, the num_draft_tokens - 1 best by score are kept, in creation
//           order. Scores never increase along a path and ties keep the earlier-created node, so
//           every kept node's ancestors are kept too.
// The caller (a drafter) runs one draft forward per step over frontier() and hands each frontier
// node's top-k tokens and log-probabilities to expand().
class DraftTreeBuilder {
 public:
  // topk >= 1; 1 <= num_draft_tokens <= kMaxDraftTreeNodes (num_draft_tokens counts the root,
  // as SGLang's --speculative-num-draft-tokens does).
  DraftTreeBuilder(int32_t root_token, int32_t topk, int32_t num_draft_tokens);

  // The nodes the next expand() must give candidates for (builder node ids; the root, id 0,
  // before the first step).
  std::span<const int32_t> frontier() const { return frontier_; }
  // Builder node `id`'s token, parent id and depth (for the drafter's own forward).
  int32_t token(int32_t id) const { return tokens_[size_t(id)]; }
  int32_t parent(int32_t id) const { return parents_[size_t(id)]; }
  int32_t depth(int32_t id) const { return depths_[size_t(id)]; }
  float score(int32_t id) const { return scores_[size_t(id)]; }

  // One draft step: tokens/logprobs [frontier().size(), topk] row-major, frontier node f's
  // candidates in row f (their order is the drafter's, best first by convention; only the
  // scores decide what is kept).
  void expand(std::span<const int32_t> tokens, std::span<const float> logprobs);

  // The tree of the kept nodes (num_draft_tokens - 1 drafts at most).
  DraftTree finish() const;

 private:
  int32_t topk_, num_draft_tokens_;
  std::vector<int32_t> tokens_, parents_, depths_;  // [builder nodes]; node 0 the root
  std::vector<float> scores_;                       // cumulative log-probability; root 0
  std::vector<int32_t> frontier_;
};

}  // namespace strata
