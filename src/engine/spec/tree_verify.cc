#include "engine/spec/tree_verify.h"

#include "core/check.h"

namespace strata {

std::vector<int32_t> TreeAcceptance::committed_tokens(const DraftTree& tree) const {
  std::vector<int32_t> out;
  for (size_t k = 1; k < path.size(); ++k) out.push_back(tree.tokens[size_t(path[k])]);
  out.push_back(next_token);
  return out;
}

TreeAcceptance accept_tree(const DraftTree& tree, std::span<const int32_t> target_tokens) {
  CHECK_EQ(target_tokens.size(), size_t(tree.size()));
  TreeAcceptance a;
  int32_t node = 0;
  a.path.push_back(0);
  while (true) {
    const int32_t t = target_tokens[size_t(node)];
    int32_t next = -1;
    // Children come after their parent; the first child with the token wins (a later sibling
    // with the same token could never be accepted under the sequential rule either).
    for (int32_t c = node + 1; c < tree.size() && next < 0; ++c)
      if (tree.parents[size_t(c)] == node && tree.tokens[size_t(c)] == t) next = c;
    if (next < 0) {
      a.next_token = t;
      return a;
    }
    a.path.push_back(next);
    node = next;
  }
}

int32_t sequential_node_step(std::span<const double> p, std::span<const int32_t> child_tokens,
                             const std::function<double()>& uniform, int32_t* correction) {
  std::vector<double> q(p.begin(), p.end());
  for (size_t j = 0; j < child_tokens.size(); ++j) {
    const size_t c = size_t(child_tokens[j]);
    CHECK_LT(c, q.size());
    double mass = 0;
    for (double x : q) mass += x;
    // Accept with probability q(c) / |q|: q is p with the rejected siblings removed.
    if (mass > 0 && uniform() * mass < q[c]) return int32_t(j);
    q[c] = 0;
  }
  double mass = 0;
  for (double x : q) mass += x;
  CHECK_MSG(mass > 0, "every token with probability was drafted and rejected");
  const double u = uniform() * mass;
  double acc = 0;
  int32_t last_nonzero = -1;
  for (size_t v = 0; v < q.size(); ++v) {
    if (q[v] <= 0) continue;
    acc += q[v];
    last_nonzero = int32_t(v);
    if (u < acc) {
      *correction = int32_t(v);
      return -1;
    }
  }
  *correction = last_nonzero;  // rounding at the top end
  return -1;
}

std::vector<std::pair<int32_t, int32_t>> accepted_kv_moves(std::span<const int32_t> path) {
  std::vector<std::pair<int32_t, int32_t>> moves;
  for (size_t k = 0; k < path.size(); ++k) {
    CHECK(k == 0 || path[k] > path[k - 1]);
    if (path[k] != int32_t(k)) moves.push_back({path[k], int32_t(k)});
  }
  return moves;
}

}  // namespace strata
