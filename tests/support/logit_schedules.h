// Batch invariance of a model's forward, at the level of its logits rows: the same sequences
// (prompt, then a forced continuation) run through Model::forward in several schedules (batch
// compositions, orders, pages, prefill chunk sizes, decode positions computed by prefill), each
// sequence's logits at every continuation position compared bitwise with the schedule "alone"
// (the sequence by itself: its prompt as one chunk, then one decode step per token). Used by the
// CPU test (tests/golden/engine/logits_invariance_test.cc) and the GPU check
// (bench/cuda/determinism_check.cc). No gtest here: the GPU check links without it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "arch/model.h"
#include "backend/backend.h"
#include "core/check.h"

namespace strata::testing {

struct ScheduledSeq {
  std::vector<int32_t> tokens;  // prompt, then the forced continuation
  int prompt = 0;
};

// One chunk of a step: tokens [begin, end) of sequence `seq`.
struct Chunk {
  int seq, begin, end;
};
using Schedule = std::vector<std::vector<Chunk>>;
// (sequence, position) -> the logits row predicting position + 1 (positions >= prompt - 1).
using LogitRows = std::map<std::pair<int, int>, std::vector<float>>;

struct InvarianceSetup {
  std::vector<ScheduledSeq> seqs;
  int cont = 6;           // forced continuation tokens per sequence
  int page = 16;          // KV page size
  int pages_per_seq = 0;  // every sequence owns this many pages
};

// `count` sequences of random prompts of min_len..max_len tokens and `cont` continuation tokens
// (ids 1 .. vocab - 1), seeded.
inline InvarianceSetup make_invariance_setup(int count, int vocab, int min_len, int max_len,
                                             int cont = 6, uint64_t seed = 11) {
  InvarianceSetup s;
  s.cont = cont;
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> len(min_len, max_len), tok(1, vocab - 1);
  s.seqs.resize(size_t(count));
  for (auto& q : s.seqs) {
    q.prompt = len(rng);
    q.tokens.resize(size_t(q.prompt + cont));
    for (auto& t : q.tokens) t = tok(rng);
    s.pages_per_seq = std::max(s.pages_per_seq, int(q.tokens.size() + s.page - 1) / s.page);
  }
  return s;
}

// Runs `schedule` on a fresh pool of `kv_dtype` (unset: the model's layout dtype); sequence q
// owns pages page_base[q] .. + pages_per_seq.
inline LogitRows run_schedule(Model& model, Backend& be, const InvarianceSetup& setup,
                              const Schedule& schedule, const std::vector<int>& page_base,
                              std::optional<DType> kv_dtype = std::nullopt) {
  const int n = int(setup.seqs.size()), page_size = setup.page;
  KvLayout lay = model.kv_layout();
  lay.page_size = page_size;
  lay.num_pages = int64_t(n) * setup.pages_per_seq;
  if (kv_dtype) lay.dtype = *kv_dtype;
  auto kv = be.alloc_kv(lay);
  const int vocab = model.spec().vocab_size;
  LogitRows out;
  for (const auto& step : schedule) {
    std::vector<int32_t> q_indptr{0}, kv_lens, page_indptr{0}, pages, pos, slots, tokens, rows;
    std::vector<std::pair<int, int>> keys;
    for (const Chunk& c : step) {
      const ScheduledSeq& s = setup.seqs[size_t(c.seq)];
      const int base = page_base[size_t(c.seq)];
      for (int i = c.begin; i < c.end; ++i) {
        if (i >= s.prompt - 1 && i < int(s.tokens.size()) - 1) {
          rows.push_back(int32_t(tokens.size()));
          keys.emplace_back(c.seq, i);
        }
        tokens.push_back(s.tokens[size_t(i)]);
        pos.push_back(i);
        slots.push_back((base + i / page_size) * page_size + i % page_size);
      }
      q_indptr.push_back(int32_t(tokens.size()));
      kv_lens.push_back(c.end);
      for (int p = 0; p < (c.end + page_size - 1) / page_size; ++p) pages.push_back(base + p);
      page_indptr.push_back(int32_t(pages.size()));
    }
    ForwardBatch fb;
    fb.token_ids = tokens.data();
    fb.attn = AttentionMetadata{.num_seqs = int(step.size()),
                                .num_tokens = int(tokens.size()),
                                .page_size = page_size,
                                .q_indptr = q_indptr.data(),
                                .kv_lens = kv_lens.data(),
                                .page_indptr = page_indptr.data(),
                                .page_indices = pages.data(),
                                .positions = pos.data(),
                                .slot_mapping = slots.data()};
    // A step without a wanted row still runs (it writes KV): the last token's row, unused.
    const bool none = rows.empty();
    if (none) rows.push_back(int32_t(tokens.size()) - 1);
    fb.logit_rows = rows.data();
    fb.num_logit_rows = int(rows.size());
    std::vector<float> logits(rows.size() * size_t(vocab));
    model.forward(fb, *kv, logits.data());
    if (none) continue;
    for (size_t r = 0; r < keys.size(); ++r)
      out[keys[r]].assign(logits.begin() + int64_t(r) * vocab,
                          logits.begin() + int64_t(r + 1) * vocab);
  }
  return out;
}

// Steps of chunks of `chunk` tokens of each sequence of `order` (its prompt, or all its tokens):
// step j holds the j-th chunk of every sequence that still has one.
inline void add_chunked(Schedule* s, const InvarianceSetup& setup, const std::vector<int>& order,
                        int chunk, bool prompt_only) {
  for (int j = 0;; ++j) {
    std::vector<Chunk> step;
    for (int q : order) {
      const ScheduledSeq& sq = setup.seqs[size_t(q)];
      const int end = prompt_only ? sq.prompt : int(sq.tokens.size());
      if (j * chunk < end) step.push_back({q, j * chunk, std::min(end, (j + 1) * chunk)});
    }
    if (step.empty()) return;
    s->push_back(std::move(step));
  }
}
// `cont` decode steps of every sequence of `order`.
inline void add_decode(Schedule* s, const InvarianceSetup& setup, const std::vector<int>& order) {
  for (int t = 0; t < setup.cont; ++t) {
    std::vector<Chunk> step;
    for (int q : order) {
      const int i = setup.seqs[size_t(q)].prompt + t;
      step.push_back({q, i, i + 1});
    }
    s->push_back(std::move(step));
  }
}

struct LogitDiff {
  int rows = 0, differing = 0, argmax_same = 0;
  double max_abs = 0;
};
// `got` against `ref`, row by row (every row of ref must be in got).
inline LogitDiff compare_rows(const LogitRows& ref, const LogitRows& got) {
  LogitDiff d;
  for (const auto& [key, a] : ref) {
    auto it = got.find(key);
    CHECK_MSG(it != got.end(), "no logits for sequence {} position {}", key.first, key.second);
    const auto& b = it->second;
    ++d.rows;
    if (std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) != 0) ++d.differing;
    for (size_t i = 0; i < a.size(); ++i)
      d.max_abs = std::max(d.max_abs, double(std::fabs(a[i] - b[i])));
    d.argmax_same += std::max_element(a.begin(), a.end()) - a.begin() ==
                     std::max_element(b.begin(), b.end()) - b.begin();
  }
  return d;
}

// Each sequence alone: its prompt in one chunk, then one decode step per continuation token.
inline LogitRows alone_rows(Model& model, Backend& be, const InvarianceSetup& setup,
                            std::optional<DType> kv_dtype = std::nullopt) {
  std::vector<int> base(setup.seqs.size());
  for (size_t q = 0; q < base.size(); ++q) base[q] = int(q) * setup.pages_per_seq;
  LogitRows all;
  for (int q = 0; q < int(setup.seqs.size()); ++q) {
    Schedule s;
    s.push_back({{q, 0, setup.seqs[size_t(q)].prompt}});
    for (int t = 0; t < setup.cont; ++t) {
      const int i = setup.seqs[size_t(q)].prompt + t;
      s.push_back({{q, i, i + 1}});
    }
    LogitRows one = run_schedule(model, be, setup, s, base, kv_dtype);
    all.insert(one.begin(), one.end());
  }
  return all;
}

struct NamedSchedule {
  std::string name;
  Schedule steps;
  std::vector<int> page_base;
};
// The schedules compared with alone:
//   batch       all prompts in one prefill batch, then decode steps of all
//   reversed    sequences in reverse order on pages in reverse order, prompts in chunks of 16
//               tokens (every sequence's chunk in each step), then decode steps
//   mixed       the first half prefill at once, then decode while the second half prefill in
//               chunks of 5 in the same steps; then the second half decode
//   as_prefill  prompt and continuation as one chunk, all sequences in one batch (the decode
//               positions computed by prefill)
inline std::vector<NamedSchedule> invariance_schedules(const InvarianceSetup& setup) {
  const int n = int(setup.seqs.size());
  const size_t count = setup.seqs.size();
  std::vector<int> in_order(count), reversed(count), base(count), base_rev(count);
  std::iota(in_order.begin(), in_order.end(), 0);
  std::reverse_copy(in_order.begin(), in_order.end(), reversed.begin());
  for (int q = 0; q < n; ++q) {
    base[size_t(q)] = q * setup.pages_per_seq;
    base_rev[size_t(q)] = (n - 1 - q) * setup.pages_per_seq;
  }
  const std::vector<int> first(in_order.begin(), in_order.begin() + n / 2),
      second(in_order.begin() + n / 2, in_order.end());
  std::vector<NamedSchedule> out;
  {
    Schedule s(1);
    for (int q : in_order) s[0].push_back({q, 0, setup.seqs[size_t(q)].prompt});
    add_decode(&s, setup, in_order);
    out.push_back({"batch", std::move(s), base});
  }
  {
    Schedule s;
    add_chunked(&s, setup, reversed, 16, true);
    add_decode(&s, setup, reversed);
    out.push_back({"reversed", std::move(s), base_rev});
  }
  {
    Schedule s(1), pre;
    for (int q : first) s[0].push_back({q, 0, setup.seqs[size_t(q)].prompt});
    add_chunked(&pre, setup, second, 5, true);
    for (size_t j = 0; j < std::max(pre.size(), size_t(setup.cont)); ++j) {
      std::vector<Chunk> step;
      if (j < size_t(setup.cont))
        for (int q : first) {
          const int i = setup.seqs[size_t(q)].prompt + int(j);
          step.push_back({q, i, i + 1});
        }
      if (j < pre.size()) step.insert(step.end(), pre[j].begin(), pre[j].end());
      s.push_back(std::move(step));
    }
    add_decode(&s, setup, second);
    out.push_back({"mixed", std::move(s), base});
  }
  {
    Schedule s(1);
    for (int q : in_order) s[0].push_back({q, 0, int(setup.seqs[size_t(q)].tokens.size())});
    out.push_back({"as_prefill", std::move(s), base});
  }
  return out;
}

}  // namespace strata::testing
