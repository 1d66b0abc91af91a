#include "engine/spec/draft_tree.h"

#include <algorithm>
#include <numeric>

#include "core/check.h"

namespace strata {

DraftTree DraftTree::root_only(int32_t root_token) {
  return DraftTree{.tokens = {root_token}, .parents = {-1}, .depths = {0}};
}

DraftTree DraftTree::chain(int32_t root_token, std::span<const int32_t> drafts) {
  DraftTree t = root_only(root_token);
  for (int32_t d : drafts) t.add(t.size() - 1, d);
  return t;
}

int32_t DraftTree::add(int32_t parent, int32_t token) {
  CHECK(parent >= 0 && parent < size());
  tokens.push_back(token);
  parents.push_back(parent);
  depths.push_back(depths[size_t(parent)] + 1);
  return size() - 1;
}

std::vector<uint64_t> DraftTree::ancestor_mask() const {
  CHECK_LE(size(), kMaxDraftTreeNodes);
  std::vector<uint64_t> mask(size_t(size()), 0);
  for (int32_t i = 0; i < size(); ++i) {
    // A parent's word is complete before its children's (parents[i] < i).
    const int32_t p = parents[size_t(i)];
    mask[size_t(i)] = (p < 0 ? 0 : mask[size_t(p)]) | (uint64_t(1) << i);
  }
  return mask;
}

std::vector<int32_t> DraftTree::children(int32_t node) const {
  std::vector<int32_t> c;
  for (int32_t i = node + 1; i < size(); ++i)
    if (parents[size_t(i)] == node) c.push_back(i);
  return c;
}

std::vector<int32_t> DraftTree::path_to(int32_t node) const {
  std::vector<int32_t> path;
  for (int32_t i = node; i >= 0; i = parents[size_t(i)]) path.push_back(i);
  std::reverse(path.begin(), path.end());
  return path;
}

std::vector<int32_t> DraftTree::path_tokens(int32_t node) const {
  std::vector<int32_t> out;
  for (int32_t i : path_to(node))
    if (i != 0) out.push_back(tokens[size_t(i)]);
  return out;
}

void DraftTree::check() const {
  CHECK_GE(size(), 1);
  CHECK_LE(size(), kMaxDraftTreeNodes);
  CHECK_EQ(parents.size(), tokens.size());
  CHECK_EQ(depths.size(), tokens.size());
  CHECK_EQ(parents[0], -1);
  CHECK_EQ(depths[0], 0);
  for (size_t i = 1; i < tokens.size(); ++i) {
    CHECK(parents[i] >= 0 && size_t(parents[i]) < i);
    CHECK_EQ(depths[i], depths[size_t(parents[i])] + 1);
  }
}

DraftTreeBuilder::DraftTreeBuilder(int32_t root_token, int32_t topk, int32_t num_draft_tokens)
    : topk_(topk),
      num_draft_tokens_(num_draft_tokens),
      tokens_{root_token},
      parents_{-1},
      depths_{0},
      scores_{0.0f},
      frontier_{0} {
  CHECK_GE(topk, 1);
  CHECK(num_draft_tokens >= 1 && num_draft_tokens <= kMaxDraftTreeNodes);
}

namespace {

// `ids` sorted best first: higher score, then earlier creation (a parent before its children).
void sort_best_first(std::vector<int32_t>& ids, const std::vector<float>& scores) {
  std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
    const float sa = scores[size_t(a)], sb = scores[size_t(b)];
    return sa != sb ? sa > sb : a < b;
  });
}

}  // namespace

void DraftTreeBuilder::expand(std::span<const int32_t> tokens, std::span<const float> logprobs) {
  const size_t rows = frontier_.size();
  CHECK_EQ(tokens.size(), rows * size_t(topk_));
  CHECK_EQ(logprobs.size(), tokens.size());
  std::vector<int32_t> created;
  for (size_t f = 0; f < rows; ++f) {
    const int32_t parent = frontier_[f];
    for (int32_t k = 0; k < topk_; ++k) {
      const size_t c = f * size_t(topk_) + size_t(k);
      created.push_back(int32_t(tokens_.size()));
      tokens_.push_back(tokens[c]);
      parents_.push_back(parent);
      depths_.push_back(depths_[size_t(parent)] + 1);
      scores_.push_back(scores_[size_t(parent)] + logprobs[c]);
    }
  }
  sort_best_first(created, scores_);
  created.resize(std::min(created.size(), size_t(topk_)));
  // The frontier in creation order, so a drafter's rows follow the tree's node order.
  std::sort(created.begin(), created.end());
  frontier_ = std::move(created);
}

DraftTree DraftTreeBuilder::finish() const {
  std::vector<int32_t> ids(tokens_.size() - 1);
  std::iota(ids.begin(), ids.end(), 1);
  sort_best_first(ids, scores_);
  ids.resize(std::min(ids.size(), size_t(num_draft_tokens_ - 1)));
  std::sort(ids.begin(), ids.end());
  // Builder id -> tree node; creation order keeps parents before children.
  std::vector<int32_t> node_of(tokens_.size(), -1);
  node_of[0] = 0;
  DraftTree tree = DraftTree::root_only(tokens_[0]);
  for (int32_t id : ids) {
    const int32_t p = node_of[size_t(parents_[size_t(id)])];
    CHECK_MSG(p >= 0, "draft tree node {} kept without its parent {}", id, parents_[size_t(id)]);
    node_of[size_t(id)] = tree.add(p, tokens_[size_t(id)]);
  }
  return tree;
}

}  // namespace strata
