// Eagle3Proposer's draft trees (--speculative-eagle-topk > 1): the draft steps of
// engine/spec/eagle3_drafter.h's header comment, batched over up to kScratchRequests requests.
#include <algorithm>

#include "core/check.h"
#include "engine/spec/draft_attention.h"
#include "engine/spec/eagle3_drafter.h"

namespace strata {

namespace {

int32_t index_of(std::span<const int32_t> ids, int32_t id) {
  const auto it = std::find(ids.begin(), ids.end(), id);
  CHECK(it != ids.end());
  return int32_t(it - ids.begin());
}

}  // namespace

int64_t Eagle3Proposer::scratch_pages_per_request(const DraftShape& shape, int page_size) {
  if (shape.topk <= 1) return 0;
  // A draft step forwards at most (num_steps - 1) · topk nodes past the prefix; the request's own
  // pages hold some of them, scratch pages the rest (one more for the page boundary).
  const int64_t rows = int64_t(shape.num_steps - 1) * shape.topk;
  return (rows + page_size - 1) / page_size + 1;
}

void Eagle3Proposer::propose_trees(std::span<const DraftQuery> queries,
                                   std::span<const size_t> which, std::vector<DraftTree>* drafts) {
  Backend& be = model_->backend();
  const DType act = be.activation_dtype();
  const int64_t h = model_->hidden_size();
  const int n = int(which.size());
  const int32_t k = shape_.topk;
  CHECK(n > 0 && n <= kScratchRequests);

  // Step 0: observe()'s candidates; the kept rows (each depth-1 node's input) lead the table.
  std::vector<DraftTreeBuilder> builders;
  std::vector<uint8_t> host;
  std::vector<std::vector<int32_t>> pages(static_cast<size_t>(n));
  const int64_t scratch = scratch_pages_per_request(shape_, page_size_);
  for (int i = 0; i < n; ++i) {
    const Request& r = *queries[which[size_t(i)]].request;
    const RequestState& st = states_.at(r.id());
    builders.emplace_back(
        r.token_at(r.kv_len()), k,
        std::min(shape_.num_draft_tokens, queries[which[size_t(i)]].max_tokens + 1));
    builders.back().expand(st.top_tokens, st.top_logprobs);
    host.insert(host.end(), st.hidden.begin(), st.hidden.end());
    pages[size_t(i)].assign(r.pages().begin(), r.pages().end());
    for (int64_t p = 0; p < scratch; ++p)
      pages[size_t(i)].push_back(int32_t(num_pages_ + i * scratch + p));
  }
  // Rows [0, n): the kept rows; then the last draft forward's hidden_out, request by request.
  const int64_t forwarded_max = int64_t(shape_.num_steps - 1) * k;
  const Tensor table = rows_of(&tree_table_, act, n + n * forwarded_max, h);
  be.upload_to(Tensor::make(host.data(), act, {n, h}), table.slice_rows(0, n));

  // Draft step s forwards every node of depths 1..s (fwd[i], builder ids in creation order: the
  // recomputed earlier frontiers, then the current one) under the tree mask, and expands the
  // current frontier (depth s) from its logit rows.
  std::vector<std::vector<int32_t>> fwd(static_cast<size_t>(n));
  DraftAttention attention(page_size_);
  std::vector<int32_t> tokens, src_rows, logit_rows, positions;
  std::vector<uint64_t> masks;
  std::vector<int32_t> cand_tokens;
  std::vector<float> cand_logprobs;
  int32_t prev_m = 0;  // rows per request of the previous draft forward
  for (int32_t step = 1; step < shape_.num_steps; ++step) {
    attention.clear();
    tokens.clear();
    src_rows.clear();
    logit_rows.clear();
    int32_t m = 0;
    for (int i = 0; i < n; ++i) {
      const Request& r = *queries[which[size_t(i)]].request;
      const DraftTreeBuilder& b = builders[size_t(i)];
      std::vector<int32_t>& f = fwd[size_t(i)];
      const size_t first_new = f.size();
      CHECK_EQ(int32_t(b.frontier().size()), k);  // topk of a step's candidates
      f.insert(f.end(), b.frontier().begin(), b.frontier().end());
      m = int32_t(f.size());
      CHECK_LE(m, kMaxDraftTreeNodes);
      positions.clear();
      masks.clear();
      for (int32_t id : f) {
        positions.push_back(r.kv_len() - 1 + b.depth(id));
        uint64_t word = 0;
        for (int32_t a = id; a != 0; a = b.parent(a)) word |= uint64_t(1) << index_of(f, a);
        masks.push_back(word);
        tokens.push_back(b.token(id));
        // Its input: the hidden_out row that proposed it (its parent's, or the kept row).
        const int32_t parent = b.parent(id);
        src_rows.push_back(parent == 0 ? i : n + i * prev_m + index_of(f, parent));
      }
      attention.add_tree(pages[size_t(i)], r.kv_len(), positions, masks);
      for (size_t j = first_new; j < f.size(); ++j) logit_rows.push_back(i * m + int32_t(j));
    }
    const int rows = n * m;
    const Tensor prev = rows_of(&tree_prev_, act, rows, h);
    be.gather_rows(table, src_rows.data(), rows, prev);
    const Eagle3Batch batch{.token_ids = tokens.data(),
                            .attn = attention.metadata(),
                            .prev_hidden = &prev,
                            .logit_rows = logit_rows.data(),
                            .num_logit_rows = int(logit_rows.size())};
    forward_rows(batch, table.slice_rows(n, n + rows), n <= graph_max_batch_);
    for (int i = 0; i < n; ++i) {
      cand_tokens.clear();
      cand_logprobs.clear();
      for (int32_t f = 0; f < k; ++f) top_tokens(i * k + f, k, &cand_tokens, &cand_logprobs);
      builders[size_t(i)].expand(cand_tokens, cand_logprobs);
    }
    prev_m = m;
  }
  for (int i = 0; i < n; ++i) (*drafts)[which[size_t(i)]] = builders[size_t(i)].finish();
}

}  // namespace strata
