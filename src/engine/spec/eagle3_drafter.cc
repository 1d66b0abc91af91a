#include "engine/spec/eagle3_drafter.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <numeric>

#include "backend/top_k.h"
#include "core/check.h"
#include "engine/spec/draft_attention.h"

namespace strata {

namespace {

// observe() forwards whose requests all have this many rows or fewer (1 + k of a verify) replay
// graphs; prefill chunks are longer.
constexpr int32_t kMaxGraphRowsPerRequest = 16;

bool pages_cover(const Request& r, int32_t tokens, int page_size) {
  return int64_t(r.pages().size()) * page_size >= tokens;
}

}  // namespace

Status check_eagle3_dir(const std::string& dir) {
  if (!std::filesystem::is_directory(dir))
    return invalid_argument("--speculative-draft-model-path {}: no such directory", dir);
  return Status::ok_status();
}

StatusOr<int64_t> eagle3_kv_bytes_per_token(const std::string& dir, DType dtype) {
  STRATA_ASSIGN_OR_RETURN(Eagle3Spec spec, load_eagle3_spec(dir));
  return 2 * int64_t(spec.layer.num_kv_heads) * spec.layer.head_dim * dtype_size(dtype);
}

Eagle3Proposer::Eagle3Proposer(std::unique_ptr<Eagle3Drafter> model, std::vector<int> aux_layers,
                               int64_t num_pages, int page_size, int graph_max_batch,
                               DraftShape shape)
    : model_(std::move(model)),
      aux_layers_(std::move(aux_layers)),
      num_pages_(num_pages),
      page_size_(page_size),
      graph_max_batch_(graph_max_batch),
      shape_(shape) {
  CHECK(shape_.topk >= 1 && shape_.num_steps >= 1);
  KvLayout layout = model_->kv_layout();
  layout.num_pages = num_pages + kScratchRequests * scratch_pages_per_request(shape_, page_size);
  layout.page_size = page_size;
  // Exact: the drafter's own precision (eagle3_kv_bytes_per_token counts the same bytes).
  layout.dtype = model_->backend().activation_dtype();
  kv_ = model_->backend().alloc_kv(layout);
}

Tensor Eagle3Proposer::rows_of(DeviceTensorPtr* buffer, DType dtype, int64_t rows, int64_t cols) {
  const Tensor* have = *buffer ? &(*buffer)->view() : nullptr;
  if (have == nullptr || have->dtype != dtype || have->dim(1) != cols || have->dim(0) < rows) {
    // Room for a graph-sized batch of verify rows at once: most steps then never grow it.
    int64_t capacity = std::max<int64_t>(64, int64_t(graph_max_batch_) * 4);
    while (capacity < rows) capacity *= 2;
    *buffer = model_->backend().alloc(dtype, {capacity, cols});
  }
  return (*buffer)->view().slice_rows(0, rows);
}

void Eagle3Proposer::forward_rows(const Eagle3Batch& batch, const Tensor& hidden_out, bool graph) {
  Backend& be = model_->backend();
  const int64_t dv = model_->draft_vocab_size();
  const int n = batch.num_logit_rows, k = int(std::min<int64_t>(shape_.topk, dv));
  top_ids_.resize(size_t(n) * size_t(k));
  top_logprobs_.resize(top_ids_.size());
  // A chain reads only the argmax: no log-probabilities.
  float* logprobs = shape_.topk > 1 ? top_logprobs_.data() : nullptr;
  // The forward ends with the top-k op or the logits' download, either of which ends a graph
  // step (cuda_backend.h).
  if (graph) be.set_graph_mode(true);
  if (TopKOp* op = top_k_op(be)) {
    DeviceTensorPtr logits = model_->forward_device_logits(batch, *kv_, hidden_out);
    if (logits) op->top_k(logits->view(), k, top_ids_.data(), logprobs);
  } else {
    logits_.resize(size_t(n) * size_t(dv));
    model_->forward(batch, *kv_, hidden_out, logits_.data());
    for (int i = 0; i < n; ++i)
      top_k_row_reference(logits_.data() + i * dv, dv, k, top_ids_.data() + size_t(i) * size_t(k),
                          logprobs == nullptr ? nullptr : logprobs + size_t(i) * size_t(k));
  }
  if (graph) be.set_graph_mode(false);
}

int32_t Eagle3Proposer::argmax_token(int i) const {
  const int64_t per_row = std::min<int64_t>(shape_.topk, model_->draft_vocab_size());
  return model_->target_token(top_ids_[size_t(i * per_row)]);
}

void Eagle3Proposer::top_tokens(int i, int k, std::vector<int32_t>* tokens,
                                std::vector<float>* logprobs) const {
  const int per_row = int(std::min<int64_t>(shape_.topk, model_->draft_vocab_size()));
  CHECK_LE(k, per_row);
  for (int j = 0; j < k; ++j) {
    const size_t at = size_t(i) * size_t(per_row) + size_t(j);
    tokens->push_back(model_->target_token(top_ids_[at]));
    logprobs->push_back(top_logprobs_[at]);
  }
}

void Eagle3Proposer::observe(std::span<const CommittedTokens> committed, int64_t capture_width,
                             DType capture_dtype, bool drafts_next) {
  Backend& be = model_->backend();
  const DType act = be.activation_dtype();
  const int64_t h = model_->hidden_size();
  CHECK_EQ(capture_width, 3 * int64_t(model_->spec().target_hidden_size));
  const int64_t row_bytes = capture_width * dtype_size(capture_dtype);
  DraftAttention attention(page_size_);
  std::vector<int32_t> tokens, last_rows, pages;
  std::vector<uint8_t> features;
  std::vector<const CommittedTokens*> seqs;
  int32_t same_rows = -1;  // every request's row count when they are all equal, else 0
  for (const CommittedTokens& c : committed) {
    // A finished request has handed its pages back: nothing to write, nothing to keep.
    if (c.count <= 0 || c.hidden == nullptr ||
        !pages_cover(*c.request, c.first_position + c.count, page_size_))
      continue;
    // A verify's rejected rows run too (SGLang's draft extend): a fixed shape per batch size.
    // Their KV lies past the committed positions, which the next draft steps and observe()s
    // rewrite before anything reads them. Their pages: the step's where the request has handed
    // them back.
    const bool padded = c.rows > c.count && int32_t(c.step_tokens.size()) == c.rows &&
                        int64_t(c.step_pages.size()) * page_size_ >= c.first_position + c.rows;
    const int32_t rows = padded ? c.rows : c.count;
    pages.assign(c.request->pages().begin(), c.request->pages().end());
    if (padded)
      for (size_t i = pages.size(); i < c.step_pages.size(); ++i) pages.push_back(c.step_pages[i]);
    attention.add(pages, c.first_position, rows);
    const auto next = padded ? c.step_tokens : c.next_tokens;
    tokens.insert(tokens.end(), next.begin(), next.begin() + rows);
    // A tree's committed positions read the accepted path's rows of the verify block.
    CHECK(c.hidden_rows.empty() || int32_t(c.hidden_rows.size()) >= rows);
    for (int32_t i = 0; i < rows; ++i) {
      const int32_t row = c.hidden_rows.empty() ? i : c.hidden_rows[size_t(i)];
      const uint8_t* src = c.hidden + int64_t(row) * row_bytes;
      features.insert(features.end(), src, src + row_bytes);
    }
    last_rows.push_back(attention.num_tokens() - rows + c.count - 1);
    seqs.push_back(&c);
    same_rows = same_rows < 0 || same_rows == rows ? rows : 0;
  }
  if (seqs.empty()) return;
  const int t = attention.num_tokens();
  const Tensor feats = rows_of(&feats_, act, t, capture_width);
  be.upload_to(Tensor::make(features.data(), capture_dtype, {t, capture_width}), feats);
  const Tensor hidden = rows_of(&hidden_, act, t, h);
  const Eagle3Batch batch{.token_ids = tokens.data(),
                          .attn = attention.metadata(),
                          .target_features = &feats,
                          .logit_rows = last_rows.data(),
                          .num_logit_rows = drafts_next ? int(last_rows.size()) : 1};
  // After a decode or verify step every request has 1 or 1 + k rows: graphs as the draft steps'
  // (prefill chunks, ragged, run eagerly). Speculation paused (!drafts_next): the KV is what
  // counts; one logit row still ends the forward with a download, which ends a backend step
  // (graph or eager) like every other forward.
  const bool graph =
      same_rows > 0 && same_rows <= kMaxGraphRowsPerRequest && int(seqs.size()) <= graph_max_batch_;
  forward_rows(batch, hidden, graph);
  if (!drafts_next) {
    // The drafter's KV of the committed positions is current; no kept row until an observe()
    // with drafts_next (propose() gives such requests no drafts meanwhile).
    for (const CommittedTokens* c : seqs) {
      RequestState& s = states_[c->request->id()];
      s.position = -1;
      s.hidden.clear();
    }
    return;
  }

  // Keep each request's last row for propose().
  const int n = int(seqs.size());
  const Tensor kept = rows_of(&kept_, act, n, h);
  be.gather_rows(hidden, last_rows.data(), n, kept);
  const int64_t hidden_bytes = h * dtype_size(act);
  std::vector<uint8_t> host(size_t(n * hidden_bytes));
  be.download(kept, host.data());
  for (int i = 0; i < n; ++i) {
    const CommittedTokens& c = *seqs[size_t(i)];
    RequestState& s = states_[c.request->id()];
    s.position = c.first_position + c.count - 1;
    s.first_draft = argmax_token(i);
    s.top_tokens.clear();
    s.top_logprobs.clear();
    if (shape_.topk > 1) top_tokens(i, shape_.topk, &s.top_tokens, &s.top_logprobs);
    s.hidden.assign(host.begin() + i * hidden_bytes, host.begin() + (i + 1) * hidden_bytes);
  }
}

void Eagle3Proposer::propose(std::span<const DraftQuery> queries, std::vector<DraftTree>* drafts) {
  drafts->clear();
  for (const DraftQuery& q : queries)
    drafts->push_back(DraftTree::root_only(q.request->token_at(q.request->kv_len())));
  if (shape_.topk == 1) {
    std::vector<std::vector<int32_t>> chains;
    propose_chain(queries, &chains);
    for (size_t q = 0; q < queries.size(); ++q)
      (*drafts)[q] = DraftTree::chain((*drafts)[q].tokens[0], chains[q]);
    return;
  }
  // Trees for the queries the drafter has a kept row for, kScratchRequests per forward.
  std::vector<size_t> which;
  for (size_t q = 0; q < queries.size(); ++q) {
    const Request& r = *queries[q].request;
    auto it = states_.find(r.id());
    if (queries[q].max_tokens <= 0 || it == states_.end() || it->second.position != r.kv_len() - 1)
      continue;
    which.push_back(q);
    if (which.size() == size_t(kScratchRequests)) {
      propose_trees(queries, which, drafts);
      which.clear();
    }
  }
  if (!which.empty()) propose_trees(queries, which, drafts);
}

void Eagle3Proposer::propose_chain(std::span<const DraftQuery> queries,
                                   std::vector<std::vector<int32_t>>* drafts) {
  drafts->assign(queries.size(), {});
  Backend& be = model_->backend();
  const DType act = be.activation_dtype();
  const int64_t h = model_->hidden_size();
  const int64_t hidden_bytes = h * dtype_size(act);

  // The first drafts (observe's), and the queries that draft further. A query drafts all
  // num_steps tokens where its pages hold their drafter KV (positions up to kv_len + num_steps -
  // 2), even past max_tokens (dropped at the end): every draft forward then has one row per
  // query, a fixed shape per batch size (one CUDA graph), instead of shrinking as requests near
  // their limit stop.
  std::vector<size_t> active;
  std::vector<int32_t> wanted(queries.size(), 0);
  std::vector<uint8_t> host;
  for (size_t q = 0; q < queries.size(); ++q) {
    const Request& r = *queries[q].request;
    auto it = states_.find(r.id());
    if (queries[q].max_tokens <= 0 || it == states_.end() || it->second.position != r.kv_len() - 1)
      continue;
    wanted[q] = pages_cover(r, r.kv_len() + shape_.num_steps - 1, page_size_)
                    ? std::max(queries[q].max_tokens, shape_.num_steps)
                    : queries[q].max_tokens;
    (*drafts)[q].push_back(it->second.first_draft);
    if (wanted[q] < 2) continue;
    CHECK_EQ(int64_t(it->second.hidden.size()), hidden_bytes);
    active.push_back(q);
    host.insert(host.end(), it->second.hidden.begin(), it->second.hidden.end());
  }
  if (active.empty()) return;
  // Two buffers: the rows still drafting are gathered from one into the other.
  int cur = 0;
  Tensor prev = rows_of(&prev_[cur], act, int64_t(active.size()), h);
  be.upload_to(Tensor::make(host.data(), act, {int64_t(active.size()), h}), prev);

  // Draft j + 1 from draft j at position kv_len - 1 + j, fed the row that drafted j.
  DraftAttention attention(page_size_);
  std::vector<int32_t> tokens, rows;
  for (int32_t j = 1; !active.empty(); ++j) {
    const int n = int(active.size());
    attention.clear();
    tokens.clear();
    for (size_t q : active) {
      const Request& r = *queries[q].request;
      const int32_t position = r.kv_len() - 1 + j;
      attention.add(r.pages(), position, 1);
      tokens.push_back((*drafts)[q].back());
    }
    rows.resize(size_t(n));
    for (int i = 0; i < n; ++i) rows[size_t(i)] = i;
    const Eagle3Batch batch{.token_ids = tokens.data(),
                            .attn = attention.metadata(),
                            .prev_hidden = &prev,
                            .logit_rows = rows.data(),
                            .num_logit_rows = n};
    // prev's rows are overwritten in place.
    forward_rows(batch, prev, n <= graph_max_batch_);
    // Requests with drafts to go stay, their rows gathered to the front.
    std::vector<size_t> still;
    std::vector<int32_t> keep;
    for (int i = 0; i < n; ++i) {
      const size_t q = active[size_t(i)];
      (*drafts)[q].push_back(argmax_token(i));
      if (int32_t((*drafts)[q].size()) < wanted[q]) {
        still.push_back(q);
        keep.push_back(i);
      }
    }
    if (!still.empty() && int(still.size()) < n) {
      cur = 1 - cur;
      const Tensor packed = rows_of(&prev_[cur], act, int64_t(still.size()), h);
      be.gather_rows(prev, keep.data(), int(keep.size()), packed);
      prev = packed;
    }
    active = std::move(still);
  }
  for (size_t q = 0; q < queries.size(); ++q)
    if (int32_t((*drafts)[q].size()) > queries[q].max_tokens)
      (*drafts)[q].resize(size_t(queries[q].max_tokens));
}

}  // namespace strata
