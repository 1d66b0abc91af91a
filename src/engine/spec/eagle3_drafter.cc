#include "engine/spec/eagle3_drafter.h"

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "core/check.h"

namespace strata {

namespace {

// The attention metadata of one drafter forward: per sequence, `count` new rows at positions
// [first, first + count) over its page table (the target's page ids).
class DraftAttention {
 public:
  explicit DraftAttention(int page_size) : page_size_(page_size) { clear(); }

  void clear() {
    q_indptr_.assign(1, 0);
    page_indptr_.assign(1, 0);
    kv_lens_.clear();
    page_indices_.clear();
    positions_.clear();
    slots_.clear();
  }

  // The request's pages must cover positions [0, first + count).
  void add(std::span<const int32_t> pages, int32_t first, int32_t count) {
    const int32_t len = first + count;
    const int32_t used = (len + page_size_ - 1) / page_size_;
    CHECK_LE(used, int32_t(pages.size()));
    q_indptr_.push_back(q_indptr_.back() + count);
    kv_lens_.push_back(len);
    page_indices_.insert(page_indices_.end(), pages.begin(), pages.begin() + used);
    page_indptr_.push_back(int32_t(page_indices_.size()));
    for (int32_t p = first; p < len; ++p) {
      positions_.push_back(p);
      slots_.push_back(pages[size_t(p / page_size_)] * page_size_ + p % page_size_);
    }
  }

  int num_tokens() const { return q_indptr_.back(); }

  AttentionMetadata metadata() const {
    return AttentionMetadata{.num_seqs = int(kv_lens_.size()),
                             .num_tokens = num_tokens(),
                             .page_size = page_size_,
                             .q_indptr = q_indptr_.data(),
                             .kv_lens = kv_lens_.data(),
                             .page_indptr = page_indptr_.data(),
                             .page_indices = page_indices_.data(),
                             .positions = positions_.data(),
                             .slot_mapping = slots_.data()};
  }

 private:
  int page_size_;
  std::vector<int32_t> q_indptr_, page_indptr_, kv_lens_, page_indices_, positions_, slots_;
};

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

Eagle3ChainDrafter::Eagle3ChainDrafter(std::unique_ptr<Eagle3Drafter> model,
                                       std::vector<int> aux_layers, int64_t num_pages,
                                       int page_size, int graph_max_batch)
    : model_(std::move(model)),
      aux_layers_(std::move(aux_layers)),
      page_size_(page_size),
      graph_max_batch_(graph_max_batch) {
  KvLayout layout = model_->kv_layout();
  layout.num_pages = num_pages;
  layout.page_size = page_size;
  // Exact: the drafter's own precision (eagle3_kv_bytes_per_token counts the same bytes).
  layout.dtype = model_->backend().activation_dtype();
  kv_ = model_->backend().alloc_kv(layout);
}

Tensor Eagle3ChainDrafter::rows_of(DeviceTensorPtr* buffer, DType dtype, int64_t rows,
                                   int64_t cols) {
  const Tensor* have = *buffer ? &(*buffer)->view() : nullptr;
  if (have == nullptr || have->dtype != dtype || have->dim(1) != cols || have->dim(0) < rows) {
    // Room for a graph-sized batch of verify rows at once: most steps then never grow it.
    int64_t capacity = std::max<int64_t>(64, int64_t(graph_max_batch_) * 4);
    while (capacity < rows) capacity *= 2;
    *buffer = model_->backend().alloc(dtype, {capacity, cols});
  }
  return (*buffer)->view().slice_rows(0, rows);
}

std::vector<int32_t> Eagle3ChainDrafter::forward_drafts(const Eagle3Batch& batch,
                                                        const Tensor& hidden_out, bool graph) {
  const int64_t dv = model_->draft_vocab_size();
  logits_.resize(size_t(batch.num_logit_rows * dv));
  // The forward ends with the logits' download, which ends a graph step (cuda_backend.h).
  if (graph) model_->backend().set_graph_mode(true);
  model_->forward(batch, *kv_, hidden_out, logits_.data());
  if (graph) model_->backend().set_graph_mode(false);
  std::vector<int32_t> ids(size_t(batch.num_logit_rows));
  for (int i = 0; i < batch.num_logit_rows; ++i)
    ids[size_t(i)] = model_->target_token(argmax_row_reference(logits_.data() + i * dv, dv));
  return ids;
}

void Eagle3ChainDrafter::observe(std::span<const CommittedTokens> committed, int64_t capture_width,
                                 DType capture_dtype) {
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
    features.insert(features.end(), c.hidden, c.hidden + rows * row_bytes);
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
                          .num_logit_rows = int(last_rows.size())};
  // After a decode or verify step every request has 1 or 1 + k rows: graphs as the draft steps'
  // (prefill chunks, ragged, run eagerly).
  const bool graph =
      same_rows > 0 && same_rows <= kMaxGraphRowsPerRequest && int(seqs.size()) <= graph_max_batch_;
  const std::vector<int32_t> first_drafts = forward_drafts(batch, hidden, graph);

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
    s.first_draft = first_drafts[size_t(i)];
    s.hidden.assign(host.begin() + i * hidden_bytes, host.begin() + (i + 1) * hidden_bytes);
  }
}

void Eagle3ChainDrafter::propose(std::span<const DraftQuery> queries,
                                 std::vector<std::vector<int32_t>>* drafts) {
  drafts->assign(queries.size(), {});
  Backend& be = model_->backend();
  const DType act = be.activation_dtype();
  const int64_t h = model_->hidden_size();
  const int64_t hidden_bytes = h * dtype_size(act);

  // The first drafts (observe's), and the queries that draft further.
  std::vector<size_t> active;
  std::vector<uint8_t> host;
  for (size_t q = 0; q < queries.size(); ++q) {
    const Request& r = *queries[q].request;
    auto it = states_.find(r.id());
    if (queries[q].max_tokens <= 0 || it == states_.end() || it->second.position != r.kv_len() - 1)
      continue;
    (*drafts)[q].push_back(it->second.first_draft);
    if (queries[q].max_tokens < 2) continue;
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
    const std::vector<int32_t> next = forward_drafts(batch, prev, n <= graph_max_batch_);
    // Requests with drafts to go stay, their rows gathered to the front.
    std::vector<size_t> still;
    std::vector<int32_t> keep;
    for (int i = 0; i < n; ++i) {
      const size_t q = active[size_t(i)];
      (*drafts)[q].push_back(next[size_t(i)]);
      if (int32_t((*drafts)[q].size()) < queries[q].max_tokens) {
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
}

}  // namespace strata
