#include "engine/batch_plan.h"

#include <algorithm>
#include <cstring>

#include "core/check.h"
#include "engine/slice_plan.h"
#include "engine/spec/draft_tree.h"

namespace strata {

namespace {

// Appends sequence `s`: tokens [start, end) (token_at(pos)), its first pages, and a logits row
// for every token at position >= logits_from (end - 1: the last; start: every row; end: none).
template <class TokenAt>
void append_seq(BatchPlan& p, int32_t s, int32_t start, int32_t end, std::span<const int32_t> pages,
                TokenAt token_at, int32_t logits_from) {
  const int32_t page_size = p.page_size;
  const int32_t num_pages = (end + page_size - 1) / page_size;
  for (int32_t pos = start; pos < end; ++pos) {
    p.token_ids.push_back(token_at(pos));
    p.positions.push_back(pos);
    p.slot_mapping.push_back(pages[size_t(pos / page_size)] * page_size + pos % page_size);
    if (pos >= logits_from) {
      p.logits_rows.push_back(static_cast<int32_t>(p.token_ids.size()) - 1);
      p.sampled_seqs.push_back(s);
    }
  }
  p.q_indptr.push_back(static_cast<int32_t>(p.token_ids.size()));
  p.kv_lens.push_back(end);
  p.page_indices.insert(p.page_indices.end(), pages.begin(), pages.begin() + num_pages);
  p.page_indptr.push_back(static_cast<int32_t>(p.page_indices.size()));
}

// The sequence just appended (its rows the last 1 + drafts + pads of p) holds a draft tree: its
// drafts take rope position kv_len() + depth, and every row its ancestor word; its pad rows are
// nodes of their own, like roots (the committed tokens and themselves, rope position kv_len()).
void add_tree(BatchPlan& p, const ScheduledSeq& seq, const Request& r) {
  CHECK_MSG(seq.num_new_tokens == 1 && seq.draft_parents.size() == seq.draft.size(),
            "request {}: a draft tree of {} drafts ({} parents) after {} new tokens", r.id(),
            seq.draft.size(), seq.draft_parents.size(), seq.num_new_tokens);
  DraftTree tree = DraftTree::root_only(r.token_at(r.kv_len()));
  for (size_t i = 0; i < seq.draft.size(); ++i) {
    CHECK_MSG(seq.draft_parents[i] >= 0 && size_t(seq.draft_parents[i]) <= i,
              "request {}: draft {} has parent {}", r.id(), i, seq.draft_parents[i]);
    tree.add(seq.draft_parents[i], seq.draft[i]);
  }
  const std::vector<uint64_t> mask = tree.ancestor_mask();
  const size_t first = p.token_ids.size() - mask.size() - size_t(seq.pad_rows);
  p.tree_mask.resize(first, 0);
  for (size_t i = 0; i < mask.size(); ++i) {
    p.positions[first + i] = r.kv_len() + tree.depths[i];
    p.tree_mask.push_back(mask[i]);
  }
  CHECK_MSG(mask.size() + size_t(seq.pad_rows) <= size_t(kMaxDraftTreeNodes),
            "request {}: {} tree nodes and {} pad rows", r.id(), mask.size(), seq.pad_rows);
  for (size_t i = mask.size(); i < mask.size() + size_t(seq.pad_rows); ++i) {
    p.positions[first + i] = r.kv_len();
    p.tree_mask.push_back(uint64_t(1) << i);
  }
}

BatchPlan empty_plan(int32_t page_size, size_t num_seqs) {
  CHECK_GE(page_size, 1);
  BatchPlan p;
  p.page_size = page_size;
  p.q_indptr.reserve(num_seqs + 1);
  p.page_indptr.reserve(num_seqs + 1);
  p.q_indptr.push_back(0);
  p.page_indptr.push_back(0);
  return p;
}

}  // namespace

PromptScoreRows prompt_score_rows(const Request& r, int32_t num_new_tokens) {
  // Position p's logits score token p + 1: positions from - 1 (at least 0) up to the prompt's
  // second-to-last, within this chunk. Only before the first output token (the engine records
  // the prompt's logprobs with it), so the rows always end where the chunk's sampled row begins.
  const int32_t from = r.prompt_score_from();
  if (from < 0 || r.output_len() > 0) return {};
  const int32_t start = r.kv_len(), end = start + num_new_tokens;
  const PromptScoreRows rows{std::max(start, std::max(from, 1) - 1),
                             std::min(end, r.prompt_len() - 1)};
  return rows.size() > 0 ? rows : PromptScoreRows{};
}

BatchPlan BatchPlan::build(std::span<const ScheduledSeq> seqs, int32_t page_size) {
  BatchPlan p = empty_plan(page_size, seqs.size());
  for (size_t s = 0; s < seqs.size(); ++s) {
    const Request& r = *seqs[s].request;
    const int32_t start = r.kv_len();
    const int32_t end = start + seqs[s].num_new_tokens;
    CHECK_MSG(seqs[s].num_new_tokens > 0 && end <= r.total_len(),
              "request {}: {} new tokens from {} of {}", r.id(), seqs[s].num_new_tokens, start,
              r.total_len());
    // Speculative decoding: the drafts follow the request's tokens, and every one of them and the
    // last real token gets a logits row (engine/spec/verify.h).
    // Pad rows (verify_shape.h) follow the drafts: the last draft again (or the last token).
    const std::vector<int32_t>& draft = seqs[s].draft;
    const int32_t pads = seqs[s].pad_rows;
    CHECK_MSG((draft.empty() && pads == 0) || seqs[s].sample,
              "request {}: drafts or pad rows on a chunk that samples nothing", r.id());
    CHECK_MSG(pads >= 0 && (pads == 0 || seqs[s].num_new_tokens == 1),
              "request {}: {} pad rows after {} new tokens", r.id(), pads, seqs[s].num_new_tokens);
    // Prompt-scoring rows come first, and meet the sampled row (end - 1) or the chunk's end.
    const PromptScoreRows score = prompt_score_rows(r, seqs[s].num_new_tokens);
    const int32_t rows_end = seqs[s].sample ? end - 1 : end;
    CHECK_MSG(score.size() == 0 || score.last == rows_end,
              "request {}: prompt scoring rows [{}, {}) apart from the chunk's rows at {}", r.id(),
              score.first, score.last, rows_end);
    const int32_t drafts_end = end + static_cast<int32_t>(draft.size());
    const int32_t kv_end = drafts_end + pads;
    const int32_t num_pages = (kv_end + page_size - 1) / page_size;
    CHECK_MSG(static_cast<int32_t>(r.pages().size()) >= num_pages,
              "request {}: {} pages for {} tokens", r.id(), r.pages().size(), kv_end);
    append_seq(
        p, static_cast<int32_t>(s), start, kv_end, r.pages(),
        [&r, &draft, end, drafts_end](int32_t pos) {
          if (pos < end) return r.token_at(pos);
          if (pos < drafts_end) return draft[size_t(pos - end)];
          return draft.empty() ? r.token_at(end - 1) : draft.back();
        },
        score.size() > 0 ? score.first
        : seqs[s].sample ? end - 1
                         : kv_end);
    if (!seqs[s].draft_parents.empty()) add_tree(p, seqs[s], r);
  }
  if (!p.tree_mask.empty()) p.tree_mask.resize(p.token_ids.size(), 0);
  return p;
}

BatchPlan build_slice_plan(std::span<const SeqSlice> seqs, int32_t page_size) {
  BatchPlan p = empty_plan(page_size, seqs.size());
  for (size_t s = 0; s < seqs.size(); ++s) {
    const SeqSlice& q = seqs[s];
    const int32_t end = q.start + static_cast<int32_t>(q.tokens.size());
    CHECK_MSG(!q.tokens.empty() && q.start >= 0, "slice {}: {} new tokens from {}", s,
              q.tokens.size(), q.start);
    CHECK_MSG(int64_t(q.pages.size()) * page_size >= end, "slice {}: {} pages for {} tokens", s,
              q.pages.size(), end);
    append_seq(
        p, static_cast<int32_t>(s), q.start, end, q.pages,
        [&q](int32_t pos) { return q.tokens[size_t(pos - q.start)]; },
        q.logits == SliceLogits::kAll    ? q.start
        : q.logits == SliceLogits::kLast ? end - 1
                                         : end);
  }
  return p;
}

AttentionMetadata BatchPlan::view() const {
  return AttentionMetadata{.num_seqs = num_seqs(),
                           .num_tokens = num_tokens(),
                           .page_size = page_size,
                           .q_indptr = q_indptr.data(),
                           .kv_lens = kv_lens.data(),
                           .page_indptr = page_indptr.data(),
                           .page_indices = page_indices.data(),
                           .positions = positions.data(),
                           .slot_mapping = slot_mapping.data(),
                           .tree_mask = tree_mask.empty() ? nullptr : tree_mask.data()};
}

namespace {

constexpr uint32_t kPlanMagic = 0x53545042;  // "STPB"
constexpr uint32_t kPlanVersion = 2;         // 2: tree_mask

void put_u32(std::vector<uint8_t>& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(uint8_t(v >> (8 * i)));
}
void put_vec(std::vector<uint8_t>& out, const std::vector<int32_t>& v) {
  put_u32(out, uint32_t(v.size()));
  for (int32_t x : v) put_u32(out, uint32_t(x));
}

struct Reader {
  std::span<const uint8_t> in;
  size_t at = 0;
  bool u32(uint32_t* v) {
    if (in.size() - at < 4) return false;
    *v = 0;
    for (int i = 0; i < 4; ++i) *v |= uint32_t(in[at + size_t(i)]) << (8 * i);
    at += 4;
    return true;
  }
  bool vec(std::vector<int32_t>* v) {
    uint32_t n = 0;
    if (!u32(&n) || (in.size() - at) / 4 < n) return false;
    v->resize(n);
    for (uint32_t i = 0; i < n; ++i) {
      uint32_t x = 0;
      u32(&x);
      (*v)[i] = int32_t(x);
    }
    return true;
  }
};

// A CSR offsets array: n + 1 entries from 0, non-decreasing, ending at `total`; or none at all
// for an empty plan.
bool valid_indptr(const std::vector<int32_t>& p, size_t n, size_t total) {
  if (p.empty()) return n == 0 && total == 0;  // a default-constructed (empty) plan
  if (p.size() != n + 1 || p.front() != 0 || size_t(p.back()) != total) return false;
  for (size_t i = 0; i < n; ++i)
    if (p[i] > p[i + 1]) return false;
  return true;
}

}  // namespace

std::vector<uint8_t> BatchPlan::serialize() const {
  std::vector<uint8_t> out;
  out.reserve(64 + 4 * (token_ids.size() * 3 + page_indices.size() + kv_lens.size() * 3));
  put_u32(out, kPlanMagic);
  put_u32(out, kPlanVersion);
  put_u32(out, uint32_t(page_size));
  for (const auto* v : {&token_ids, &positions, &q_indptr, &kv_lens, &page_indptr, &page_indices,
                        &slot_mapping, &logits_rows, &sampled_seqs})
    put_vec(out, *v);
  put_u32(out, uint32_t(tree_mask.size()));
  for (uint64_t w : tree_mask) {
    put_u32(out, uint32_t(w));
    put_u32(out, uint32_t(w >> 32));
  }
  return out;
}

StatusOr<BatchPlan> BatchPlan::deserialize(std::span<const uint8_t> bytes) {
  Reader r{bytes};
  uint32_t magic = 0, version = 0, page_size = 0;
  if (!r.u32(&magic) || magic != kPlanMagic) return data_loss("batch plan message: bad magic");
  if (!r.u32(&version) || version != kPlanVersion)
    return data_loss("batch plan message: version {} (this build reads {})", version, kPlanVersion);
  BatchPlan p;
  if (!r.u32(&page_size) || page_size < 1 || page_size > (1u << 20))
    return data_loss("batch plan message: bad page size {}", page_size);
  p.page_size = int32_t(page_size);
  for (auto* v : {&p.token_ids, &p.positions, &p.q_indptr, &p.kv_lens, &p.page_indptr,
                  &p.page_indices, &p.slot_mapping, &p.logits_rows, &p.sampled_seqs})
    if (!r.vec(v))
      return data_loss("batch plan message: truncated at byte {} of {}", r.at, bytes.size());
  uint32_t mask_words = 0;
  if (!r.u32(&mask_words) || (bytes.size() - r.at) / 8 < mask_words)
    return data_loss("batch plan message: truncated at byte {} of {}", r.at, bytes.size());
  p.tree_mask.resize(mask_words);
  for (uint64_t& w : p.tree_mask) {
    uint32_t lo = 0, hi = 0;
    r.u32(&lo);
    r.u32(&hi);
    w = uint64_t(hi) << 32 | lo;
  }
  if (r.at != bytes.size())
    return data_loss("batch plan message: {} trailing bytes", bytes.size() - r.at);
  const size_t seqs = p.kv_lens.size(), tokens = p.token_ids.size();
  if (p.positions.size() != tokens || p.slot_mapping.size() != tokens ||
      !valid_indptr(p.q_indptr, seqs, tokens) ||
      !valid_indptr(p.page_indptr, seqs, p.page_indices.size()) ||
      p.sampled_seqs.size() != p.logits_rows.size() ||
      (!p.tree_mask.empty() && p.tree_mask.size() != tokens))
    return data_loss("batch plan message: inconsistent lengths ({} seqs, {} tokens)", seqs, tokens);
  for (size_t s = 0; s < seqs; ++s) {
    const int64_t new_tokens = p.q_indptr[s + 1] - p.q_indptr[s];
    const int64_t pages = p.page_indptr[s + 1] - p.page_indptr[s];
    if (p.kv_lens[s] < new_tokens || int64_t(p.kv_lens[s]) > pages * p.page_size)
      return data_loss("batch plan message: sequence {} has {} tokens of context on {} pages", s,
                       p.kv_lens[s], pages);
  }
  for (size_t i = 0; i < p.logits_rows.size(); ++i)
    if (p.logits_rows[i] < 0 || size_t(p.logits_rows[i]) >= tokens || p.sampled_seqs[i] < 0 ||
        size_t(p.sampled_seqs[i]) >= seqs)
      return data_loss("batch plan message: logits row {} out of range", i);
  for (int32_t x : p.page_indices)
    if (x < 0) return data_loss("batch plan message: negative page id {}", x);
  for (size_t i = 0; i < tokens; ++i)
    if (p.slot_mapping[i] < 0 || p.positions[i] < 0)
      return data_loss("batch plan message: negative slot or position");
  // A tree word sees only its own sequence's new tokens up to itself (the backends index by it).
  if (!p.tree_mask.empty())
    for (size_t s = 0; s < seqs; ++s)
      for (int32_t t = p.q_indptr[s]; t < p.q_indptr[s + 1]; ++t) {
        const uint64_t w = p.tree_mask[size_t(t)];
        const int32_t i = t - p.q_indptr[s];
        if (w != 0 && (p.q_indptr[s + 1] - p.q_indptr[s] > 64 || (w >> i) != 1))
          return data_loss("batch plan message: bad tree mask of token {}", t);
      }
  return p;
}

}  // namespace strata
